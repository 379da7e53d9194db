"""The alert receiver (issue 44 section 2): Alertmanager's webhook -> `provision health` + `provision remediate` for
the node an acting alert names. `payload` decides (pure), `store` remembers, `server` serves HTTP and acts."""
