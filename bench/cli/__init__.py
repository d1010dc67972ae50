"""Start-up of ``ki`` commands: wall time from exec to exit of the light commands (``make bench-cli``)."""
