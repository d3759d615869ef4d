"""The primitive pool: filters indexed Gough-style, shared by both engines."""
