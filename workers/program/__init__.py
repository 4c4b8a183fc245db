"""Running a user's own training loop (`program:`) on one rank: its environment, its session, its process."""
