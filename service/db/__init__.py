"""The control plane's database: models, engine/session setup, migrations, repository."""
