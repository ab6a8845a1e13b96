"""Hardware profiles shipped with MoFa: one TOML file per accelerator (package data)."""
