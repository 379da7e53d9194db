"""ansible-runner's event callback as `provision` runs it (AWX_LIB_DIRECTORY points ansible-runner here)."""
