"""The controller: sources, the work queue, the state owners and reconcile."""
