package store

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// History is the run history both backends keep: SQLite (Store, the
// embedded default for one machine) and PostgreSQL (Postgres, shared by
// every host and gateway of a cell). Both pass one test suite.
//
// It holds runs, steps, events and files only; other records (lessons,
// the cell's hosts and sessions) are separate interfaces, so a backend can
// grow them one at a time.
type History interface {
	CreateRun(ctx context.Context, r Run) (*Run, error)
	GetRun(ctx context.Context, id string) (*Run, error)
	UpdateRun(ctx context.Context, id string, update func(*Run) error) (*Run, error)
	ListRuns(ctx context.Context, opts ListOptions) ([]Run, error)
	LookupRunID(ctx context.Context, prefix string) (string, error)
	DeleteRun(ctx context.Context, id string) error

	AppendStep(ctx context.Context, st Step) (*Step, error)
	ListSteps(ctx context.Context, runID string) ([]Step, error)

	AppendEvent(ctx context.Context, runID, typ string, data json.RawMessage) (*Event, error)
	AppendEvents(ctx context.Context, runID string, events []Event) ([]Event, error)
	ListEvents(ctx context.Context, runID string, since int64, limit int) ([]Event, error)

	PutArtifacts(ctx context.Context, runID string, files []Artifact) error
	ListArtifacts(ctx context.Context, runID string) ([]Artifact, error)
	Artifact(ctx context.Context, runID, path string) (*Artifact, error)

	ExportRun(ctx context.Context, id string, w io.Writer) error
	Close() error
}

var (
	_ History = (*Store)(nil)
	_ History = (*Postgres)(nil)
)

// IsPostgresURL says whether database names a PostgreSQL server
// (postgres:// or postgresql://) rather than a SQLite file.
func IsPostgresURL(database string) bool {
	return strings.HasPrefix(database, "postgres://") || strings.HasPrefix(database, "postgresql://")
}

// OpenHistory opens the run history named by database: a PostgreSQL URL,
// or else the path of a SQLite file. opts may be nil.
func OpenHistory(ctx context.Context, database string, opts *Options) (History, error) {
	if IsPostgresURL(database) {
		return OpenPostgres(ctx, database, opts)
	}
	if database == "" {
		return nil, fmt.Errorf("store: no database given")
	}
	return Open(ctx, database, opts)
}
