"""tenancy: tenant quotas and user-code flag, token scopes/expiry/revocation, audit log

Revision ID: 0003
Revises: 0002
"""
import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMNs, not batch mode: SQLite's batch copy would drop `tenants`, which the
    # tokens' and jobs' foreign keys refer to.
    op.add_column('tenants', sa.Column('max_workers', sa.Integer(), nullable=True))
    op.add_column('tenants', sa.Column('max_queued_jobs', sa.Integer(), nullable=True))
    op.add_column('tenants', sa.Column('quota_mode', sa.String(length=16), nullable=False, server_default='reject'))
    op.add_column('tenants', sa.Column('allow_user_code', sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column('api_tokens', sa.Column('scopes', sa.String(length=64), nullable=False, server_default='read,submit'))
    op.add_column('api_tokens', sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('api_tokens', sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True))
    # Tokens from before scopes: admins keep every scope, the others read and submit.
    op.execute("UPDATE api_tokens SET scopes = 'read,submit,admin' WHERE is_admin")
    # The admin tenant may run user code (as it could before this revision).
    op.execute("UPDATE tenants SET allow_user_code = true WHERE name = 'admin'")

    op.create_table('audit_log',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('ts', sa.DateTime(timezone=True), nullable=False),
    sa.Column('tenant_id', sa.String(length=32), nullable=False),
    sa.Column('token_id', sa.Integer(), nullable=False),
    sa.Column('token_name', sa.String(length=64), nullable=False),
    sa.Column('action', sa.String(length=32), nullable=False),
    sa.Column('target', sa.String(length=128), nullable=True),
    sa.Column('target_tenant_id', sa.String(length=32), nullable=True),
    sa.Column('status', sa.Integer(), nullable=False),
    sa.Column('outcome', sa.String(length=16), nullable=False),
    sa.Column('detail', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.create_index('ix_audit_tenant_id', ['tenant_id', 'id'], unique=False)
        batch_op.create_index('ix_audit_target_tenant_id', ['target_tenant_id', 'id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.drop_index('ix_audit_target_tenant_id')
        batch_op.drop_index('ix_audit_tenant_id')
    op.drop_table('audit_log')
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.drop_column('revoked_at')
        batch_op.drop_column('expires_at')
        batch_op.drop_column('scopes')
    with op.batch_alter_table('tenants', schema=None) as batch_op:
        batch_op.drop_column('allow_user_code')
        batch_op.drop_column('quota_mode')
        batch_op.drop_column('max_queued_jobs')
        batch_op.drop_column('max_workers')
