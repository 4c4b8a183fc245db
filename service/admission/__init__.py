"""Admission: a submit from decoded spec to committed row (service/admission/submit.py).

This file imports nothing, so `service/db` can use the refusal types (refusals.py) without
pulling in the submit path, which imports `service/db`.
"""
