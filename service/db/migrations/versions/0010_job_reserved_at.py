"""job reserved_at: when the fair scheduler began holding capacity for this queued job (its
reservation), null when none is held; written when the reservation changes, read by GET /v1/queue

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07 01:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('reserved_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('reserved_at')
