"""pending preemption on the job row: the reconciler's pass reads it with the job, no scan of events

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06 12:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('jobs', sa.Column('preempt_by', sa.String(length=32), nullable=True))
    op.add_column('jobs', sa.Column('preempt_epoch', sa.Integer(), nullable=True))
    # A request made before this revision to a job still running: carried over from its event.
    jobs = sa.table('jobs', sa.column('id', sa.String), sa.column('state', sa.String),
                    sa.column('supervisor_epoch', sa.Integer), sa.column('preempt_by', sa.String),
                    sa.column('preempt_epoch', sa.Integer))
    events = sa.table('job_events', sa.column('id', sa.Integer), sa.column('job_id', sa.String),
                      sa.column('kind', sa.String), sa.column('data', sa.JSON))
    bind = op.get_bind()
    rows = bind.execute(sa.select(events.c.job_id, events.c.data, jobs.c.supervisor_epoch)
                        .join(jobs, jobs.c.id == events.c.job_id)
                        .where(events.c.kind == 'preempt_requested',
                               jobs.c.state.in_(['STARTING', 'RUNNING', 'RECOVERING']))
                        .order_by(events.c.id)).all()
    pending = {job_id: data['by'] for job_id, data, epoch in rows if (data or {}).get('epoch') == epoch}
    for job_id, by in pending.items():
        bind.execute(sa.update(jobs).where(jobs.c.id == job_id)
                     .values(preempt_by=by, preempt_epoch=jobs.c.supervisor_epoch))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('preempt_epoch')
        batch.drop_column('preempt_by')
