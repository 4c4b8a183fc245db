"""fair queues: a tenant's weight and reserve_after_s, a job's queued_at, the scheduler's incremental reads

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06 10:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMNs, not batch mode: SQLite's batch copy would drop `tenants`, which the
    # tokens' and jobs' foreign keys refer to (as in 0003).
    op.add_column('tenants', sa.Column('weight', sa.Float(), nullable=False, server_default='1'))
    op.add_column('tenants', sa.Column('reserve_after_s', sa.Float(), nullable=True))
    op.add_column('jobs', sa.Column('queued_at', sa.DateTime(timezone=True), nullable=True))
    # A job from before this revision counts its wait from its submit (one requeued since then
    # earns its reservation a little early: harmless).
    op.execute("UPDATE jobs SET queued_at = created_at")
    op.create_index('ix_jobs_queued_at', 'jobs', ['queued_at'], unique=False)
    op.create_index('ix_jobs_finished_at', 'jobs', ['finished_at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_jobs_finished_at', table_name='jobs')
    op.drop_index('ix_jobs_queued_at', table_name='jobs')
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('queued_at')
    with op.batch_alter_table('tenants') as batch:
        batch.drop_column('reserve_after_s')
        batch.drop_column('weight')
