"""Day-2 operations in one place: pure decisions (lifecycle, policy, rails, rollout, drain) apart from the one
executor that acts on nodes, balancers, BMCs and the ledger; `service` is the entry the commands, the timer and the
alert receiver call. docs/development.md has the picture."""
