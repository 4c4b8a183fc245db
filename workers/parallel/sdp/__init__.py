"""Subnetwork Data Parallelism: each worker trains a structurally complete subnetwork.

strategy.py   the SDP strategy: wraps the rank's subnetwork, syncs, saves full-model checkpoints
assignment.py the spec's masks on a built model (its repeated blocks, who holds which)
plan.py       the planner's memory and comm prediction, from worker 0's subnetwork on the meta device
masks.py      which worker holds which blocks / hidden units (deterministic, balanced, connected)
subnetwork.py the rank's model: masked components dropped (forward) or frozen (backward)
sync.py       averaging every shared piece among exactly its holders, one group per holder set
"""
