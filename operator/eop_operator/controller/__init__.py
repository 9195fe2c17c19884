"""The controller: kopf wiring, the lifecycle loop and the health monitor (I/O at the edges).

``registration`` tells kopf what to watch and which handler each event
reaches; ``context`` is what the handlers share (options, the API client, the
status writer); ``lifecycle`` runs each pipeline's steps one at a time and
``step`` is one of them (read, decide, record, act); ``renderer`` admits and
renders; ``finalizer`` honours checkpoint retention; ``health_monitor`` checks
each pipeline's lag and keeps its progress group alive.  Decisions are not
made here: they are ``reconcile``'s pure functions.
"""
