"""The fleet simulator (`python -m bench.fleet`): the real service on a simulated cluster; see __main__."""
