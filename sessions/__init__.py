"""The session store: one directory per session, shared by the console and the command line."""

from sessions.store import Session, SessionError, SessionInfo, SessionStore, default_home

__all__ = ["Session", "SessionError", "SessionInfo", "SessionStore", "default_home"]
