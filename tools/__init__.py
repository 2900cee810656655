"""The project's own developer tools (not part of the installed package)."""
