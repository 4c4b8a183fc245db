"""The simulator's rule for a probe that fits: free GPUs, less those spoken for by admitted jobs whose
group is not created yet and less the reservation of the moment, left one for the whole reaction time."""

from __future__ import annotations

from bench.fleet.admission import fitted, spoken_for


def test_gpus_of_admitted_jobs_without_a_created_group_are_spoken_for():
    forming = [("a", 1, 8.0), ("b", 2, 4.0), ("c", 1, 1.0)]
    assert spoken_for(forming, created={("a", 1)}) == 5.0
    assert spoken_for(forming, created={("b", 1)}) == 13.0  # an earlier epoch's group is not this attempt's


def test_a_probe_fits_only_if_every_sample_of_its_reaction_time_left_a_gpu_beyond_the_reservation():
    free = [(10.0 + i / 10, 3.0) for i in range(11)]
    assert fitted(free, 10.0, reservations=[])
    assert fitted(free, 10.0, reservations=[(9.0, 12.0, 2.0)])  # 3 free, 2 held: one left
    assert not fitted(free, 10.0, reservations=[(10.5, 12.0, 3.0)])  # held from midway: none left then
    dip = free[:5] + [(10.5, 0.0)] + free[6:]
    assert not fitted(dip, 10.0, reservations=[])
    assert not fitted(free, 20.0, reservations=[])  # no sample after the submit: not known to fit
