"""MoFa's built-in plugins: one module per feature, each declared as its own entry point in
the ``mofa`` group of ``pyproject.toml`` and loaded exactly as a third party's would be.
Installed, this folder is the ``mofa_plugins`` package."""
