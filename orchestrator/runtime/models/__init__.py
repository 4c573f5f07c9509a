"""Python-backend model implementations; each repository ``model.py`` re-exports one."""
