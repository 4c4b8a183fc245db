"""program metrics: a job's other reported metrics, and steps without a loss

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 18:10:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job_metrics') as batch:  # SQLite alters a column by copying the table
        batch.add_column(sa.Column('extra', sa.JSON(), nullable=True))
        batch.alter_column('loss', existing_type=sa.Float(), nullable=True)


def downgrade() -> None:
    with op.batch_alter_table('job_metrics') as batch:
        batch.drop_column('extra')
        batch.alter_column('loss', existing_type=sa.Float(), nullable=False)
