"""Model architectures shipped with MoFa: one TOML file per model (package data)."""
