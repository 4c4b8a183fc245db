"""job phase: a running job's phase outside its steps (validation, checkpoint upload, export), as the
supervisor last drained it (workers/phases.py Progress.view)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06 02:40:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('phase', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('phase')
