package jail

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"
)

// A cgroup v2 group shared with other processes (a login session's scope,
// a CI step, go test's group) cannot be delegated to sandloop. Where
// systemd is the init, sandloop asks it for a group of its own, as runc,
// crun and Podman do: a transient scope, sandloop-PID.scope, holding only
// sandloop's own PID, with Delegate=yes, so that sandloop may create
// groups below it and enable controllers for them. As root it asks the
// system manager, otherwise the user's manager (systemd --user), over
// D-Bus.

// errNoSystemd says that no systemd manager can be asked: systemd is not
// the init, or (without root) the user's bus cannot be found.
var errNoSystemd = errors.New("systemd is not the init")

// systemdBooted says whether systemd is the init (sd_booted(3): systemd
// creates /run/systemd/system early at boot). Tests replace it.
var systemdBooted = func() bool { return exists("/run/systemd/system") }

// scopeTimeout bounds the wait for systemd's answer: it starts a scope in
// milliseconds, and a manager that does not answer must not hang sandloop.
var scopeTimeout = 15 * time.Second

// systemdBus connects to the manager that can give this process a scope:
// as root the system manager (the system bus, $DBUS_SYSTEM_BUS_ADDRESS,
// else systemd's private socket), otherwise the user's manager on the
// user's bus ($DBUS_SESSION_BUS_ADDRESS, else $XDG_RUNTIME_DIR/bus; never
// a bus started for the purpose).
func systemdBus(ctx context.Context) (*sddbus.Conn, string, error) {
	if !systemdBooted() {
		return nil, "", errNoSystemd
	}
	if os.Geteuid() == 0 {
		c, err := sddbus.NewWithContext(ctx)
		return c, "system.slice", err
	}
	c, err := sddbus.NewConnection(func() (*dbus.Conn, error) {
		conn, err := dbus.SessionBusPrivateNoAutoStartup(dbus.WithContext(ctx))
		if err != nil {
			if os.Getenv("DBUS_SESSION_BUS_ADDRESS") == "" && !exists(filepath.Join(os.Getenv("XDG_RUNTIME_DIR"), "bus")) {
				err = fmt.Errorf("no $DBUS_SESSION_BUS_ADDRESS, no $XDG_RUNTIME_DIR/bus (log in, or loginctl enable-linger): %w", err)
			}
			return nil, fmt.Errorf("the user's systemd manager: %w", err)
		}
		// The uid, not a user name: looking a name up needs cgo.
		if err := conn.Auth([]dbus.Auth{dbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err != nil {
			conn.Close()
			return nil, err
		}
		if err := conn.Hello(); err != nil {
			conn.Close()
			return nil, err
		}
		return conn, nil
	})
	return c, "user.slice", err
}

// scopeName is the transient scope sandloop asks for.
func scopeName(pid int) string { return "sandloop-" + strconv.Itoa(pid) + ".scope" }

// scopeProperties are the properties of the scope: this process alone,
// its groups delegated, in slice.
func scopeProperties(pid int, slice string) []sddbus.Property {
	return []sddbus.Property{
		sddbus.PropDescription("sandloop " + strconv.Itoa(pid) + " and its sandboxes"),
		sddbus.PropSlice(slice),
		sddbus.PropPids(uint32(pid)),
		{Name: "Delegate", Value: dbus.MakeVariant(true)},
		// Stopped with the slice, not ordered after the session's units.
		{Name: "DefaultDependencies", Value: dbus.MakeVariant(false)},
	}
}

// startScope asks systemd over conn for a delegated scope holding this
// process and waits (bounded) for the job to finish. When it returns nil,
// systemd has moved this process into the scope; the caller reads
// /proc/self/cgroup again.
func startScope(ctx context.Context, conn *sddbus.Conn, slice string) error {
	ctx, cancel := context.WithTimeout(ctx, scopeTimeout)
	defer cancel()
	pid := os.Getpid()
	name := scopeName(pid)
	done := make(chan string, 1)
	// "fail": refuse rather than replace a unit of the same name.
	if _, err := conn.StartTransientUnitContext(ctx, name, "fail", scopeProperties(pid, slice), done); err != nil {
		return fmt.Errorf("ask systemd for a delegated scope %s: %w", name, err)
	}
	select {
	case result := <-done:
		if result != "done" {
			return fmt.Errorf("systemd's job for the scope %s ended %q (journalctl -u %s says why)", name, result, name)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("systemd did not start the scope %s within %v", name, scopeTimeout)
	}
}

// systemdScope asks systemd for a delegated scope holding this process and
// returns the process's group afterwards (own computes it from
// /proc/self/cgroup). errNoSystemd when there is no systemd to ask.
func systemdScope(own func() string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), scopeTimeout)
	defer cancel()
	conn, slice, err := systemdBus(ctx)
	if err != nil {
		if errors.Is(err, errNoSystemd) {
			return "", err
		}
		return "", fmt.Errorf("connect to systemd: %w", err)
	}
	defer conn.Close()
	before := own()
	if err := startScope(ctx, conn, slice); err != nil {
		return "", err
	}
	after := own()
	if name := scopeName(os.Getpid()); after == before || filepath.Base(after) != name {
		return "", fmt.Errorf("systemd started the scope %s, but this process is in %s", name, after)
	}
	return after, nil
}
