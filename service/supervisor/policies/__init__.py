"""Supervisor policies: pure functions from a frozen status to a typed decision.

Each module takes a status the run loop builds (service/supervisor/run.py) and returns what
to do; none of them waits, sleeps or touches Ray, so each is testable on hand-built statuses
(tests/service/test_supervisor_policies.py). The run loop applies the decisions.
"""
