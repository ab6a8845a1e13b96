"""Example third-party MoFa plugins (see README.md)."""
