package tools

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// SnapshotName is the snapshot tool's name.
const SnapshotName = "snapshot"

// SnapshotInput is snapshot's arguments.
type SnapshotInput struct {
	Name    string `json:"name,omitempty" jsonschema:"A short name to remember it by (optional)."`
	Restore string `json:"restore,omitempty" jsonschema:"The id of a snapshot (snap-...) to continue from, in a new session, instead of taking one."`
}

// Snapshot is a durable snapshot as the tool tells the model of it.
type Snapshot struct {
	ID        string
	Files     int
	Bytes     int64
	NewBytes  int64
	Variables []string
	NotSaved  []string // "name: reason"
}

// Snapshotter is a Session that the snapshot tool works on.
type Snapshotter interface {
	// Snapshot writes the session to durable storage, named name.
	Snapshot(ctx context.Context, name string) (*Snapshot, error)
	// FromSnapshot starts a new session from snapshot id and makes it the
	// current one; it returns the new session's id and the one left.
	FromSnapshot(ctx context.Context, id string) (child, parent string, r *Restored, err error)
}

//go:embed snapshot.md
var snapshotMD string

var snapshotTool = define(spec{
	name:        SnapshotName,
	description: snapshotMD,
	annotations: func(*Config) *mcp.ToolAnnotations {
		return &mcp.ToolAnnotations{Title: "Snapshot the session durably", DestructiveHint: boolPtr(false), OpenWorldHint: boolPtr(false)}
	},
}, func(ctx context.Context, c *call, in SnapshotInput) (*Result, error) {
	sn, ok := c.sess.(Snapshotter)
	if !ok {
		return nil, errors.New("this server keeps no snapshots; use checkpoint to save the session in memory")
	}
	if len(in.Name) > 100 {
		return nil, argErr("name", "name: at most 100 characters")
	}
	if in.Restore != "" {
		if in.Name != "" {
			return nil, argErr("name", "give a name to take a snapshot, or restore to continue from one, not both")
		}
		child, parent, r, err := sn.FromSnapshot(ctx, in.Restore)
		if err != nil {
			return nil, err
		}
		var b strings.Builder
		fmt.Fprintf(&b, "You are now working in session %s, started from %s. Session %s is kept as it was; go back to it with fork_session {\"switch_to\": %q}.\n", child, in.Restore, parent, parent)
		b.WriteString(restoredText(r))
		return textResult(b.String()), nil
	}
	s, err := sn.Snapshot(ctx, in.Name)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Snapshot %s saved: %s in /workspace (%s; %s written, the rest was stored already).", s.ID, plural(s.Files, "file"), formatBytes(s.Bytes), formatBytes(s.NewBytes))
	if len(s.Variables) > 0 {
		fmt.Fprintf(&b, "\nVariables saved: %s.", strings.Join(s.Variables, ", "))
	}
	if len(s.NotSaved) > 0 {
		b.WriteString("\nNOT saved (a restore will not bring these back):")
		for _, n := range s.NotSaved {
			b.WriteString("\n- " + n)
		}
	}
	fmt.Fprintf(&b, "\nContinue from it later with snapshot {\"restore\": %q}.", s.ID)
	return textResult(b.String()), nil
})
