"""What runs a `program` job (the user's own training loop) inside the workers."""
