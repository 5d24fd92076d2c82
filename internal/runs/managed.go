package runs

import (
	"context"

	"github.com/sandloop/sandloop/internal/session"
)

// SessionOwner owns the sessions of agent runs in a session.Manager. No
// API token's owner is ever this name, so no API caller can reach them.
const SessionOwner = "\x00runs"

// ManagerSessions returns an Options.NewSession that creates each run's
// session in mgr (from its warm pool when it has one), owned by
// SessionOwner, in use for the whole run (never reaped as idle while the
// model thinks; MaxLifetime still applies), and given back when the run
// ends.
func ManagerSessions(mgr *session.Manager) func(context.Context) (Session, error) {
	return func(ctx context.Context) (Session, error) {
		ms, err := mgr.Create(ctx, session.CreateOptions{Owner: SessionOwner})
		if err != nil {
			return nil, err
		}
		ms.Pin()
		return ms, nil
	}
}
