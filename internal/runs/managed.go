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
// SessionOwner, and deletes it when the run ends.
func ManagerSessions(mgr *session.Manager) func(context.Context) (Session, error) {
	return func(ctx context.Context) (Session, error) {
		ms, err := mgr.Create(ctx, session.CreateOptions{Owner: SessionOwner})
		if err != nil {
			return nil, err
		}
		return managed{ms, mgr}, nil
	}
}

// managed is a run's session in a manager.
type managed struct {
	*session.Managed
	mgr *session.Manager
}

func (m managed) Close() error { return m.mgr.Delete(SessionOwner, m.ID()) }
