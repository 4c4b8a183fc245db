"""Supervisors are placed by a resource of their own: the chart gives it to the Ray head and tells
the service its name and the memory each supervisor reserves. The head's slots fit its memory:
derived from it by default, and more than it holds is refused at install."""

from __future__ import annotations

import json

import pytest

from tests.deploy.chart import one, refusal, render
from tests.deploy.test_chart_settings import control_plane_env


def test_the_head_holds_the_supervisors_resource_and_the_service_asks_for_it():
    docs = render({"ray": {"cluster": {"supervisors": {"resource": "ty-sup", "slots": 40, "memoryMb": 128}}}})
    head = one(docs, "RayCluster")["spec"]["headGroupSpec"]["rayStartParams"]
    assert json.loads(head["resources"]) == {"ty-sup": 40}
    env = control_plane_env(docs)
    assert env["TRAINYARD_SUPERVISOR_RESOURCE"] == "ty-sup" and env["TRAINYARD_SUPERVISOR_MEMORY_MB"] == "128"


def test_without_the_charts_ray_cluster_the_settings_decide():
    docs = render({"ray": {"cluster": {"enabled": False}, "address": "ray://elsewhere:10001"},
                   "settings": {"supervisorResource": "", "supervisorMemoryMb": 0}})
    env = control_plane_env(docs)
    assert env["TRAINYARD_SUPERVISOR_RESOURCE"] == "" and env["TRAINYARD_SUPERVISOR_MEMORY_MB"] == "0"


def head_params(values: dict) -> dict:
    return one(render(values), "RayCluster")["spec"]["headGroupSpec"]["rayStartParams"]


MIB = 2**20


@pytest.mark.parametrize("head_memory, reserved, each",
                         [("8Gi", 2048, 256), ("16Gi", 2048, 256), ("6144Mi", 1024, 128)])
def test_the_slots_are_what_the_heads_memory_holds(head_memory, reserved, each):
    values = {"ray": {"cluster": {"supervisors": {"memoryMb": each, "headReservedMb": reserved},
                                  "head": {"resources": {"limits": {"memory": head_memory},
                                                         "requests": {"memory": head_memory}}}}}}
    params = head_params(values)
    slots = json.loads(params["resources"])["trainyard-supervisor"]
    limit_mib = int(head_memory[:-2]) * (1024 if head_memory.endswith("Gi") else 1)
    offered = int(params["memory"]) // MIB  # the Ray memory the head offers: all of it to supervisors
    assert offered == limit_mib - reserved
    assert slots == offered // each and slots * each <= offered < (slots + 1) * each
    assert int(params["object-store-memory"]) // MIB < reserved


def test_the_defaults_are_consistent():
    params = head_params({})
    slots = json.loads(params["resources"])["trainyard-supervisor"]
    assert slots == (8192 - 2048) // 256 == 24
    assert slots * 256 * MIB <= int(params["memory"]) and int(params["object-store-memory"]) == 512 * MIB


def test_more_slots_than_the_heads_memory_holds_are_refused():
    message = refusal({"ray": {"cluster": {"supervisors": {"slots": 1000, "memoryMb": 256}}}})
    assert "ray.cluster.supervisors.slots=1000 x memoryMb=256 = 256000 MiB exceeds the 6144 MiB" in message
    assert "ray.cluster.head.resources.limits.memory=8Gi" in message and "which holds 24" in message


def test_a_head_too_small_for_one_supervisor_is_refused():
    message = refusal({"ray": {"cluster": {"head": {"resources": {"limits": {"memory": "2Gi"},
                                                                  "requests": {"memory": "2Gi"}}}}}})
    assert "leaves 0 MiB for supervisors, less than one supervisor's ray.cluster.supervisors.memoryMb=256" in message


def test_slots_that_fit_are_kept_as_given():
    params = head_params({"ray": {"cluster": {"supervisors": {"slots": 10}}}})
    assert json.loads(params["resources"]) == {"trainyard-supervisor": 10}
