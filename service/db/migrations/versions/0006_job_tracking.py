"""job tracking: the MLflow run and TensorBoard directory of a job with a `tracking` section

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 03:20:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('tracking', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('tracking')
