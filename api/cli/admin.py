"""`trainyard tenant-create | tenant-list | tenant-update | token-create | token-list | token-revoke | audit`:
administration from the command line (an admin-scoped token: TRAINYARD_TOKEN or the admin token)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from api.cli.client import ApiFailure, Client
from api.cli.output import fail, out


def _call(method: str, path: str, **kwargs) -> dict:
    try:
        return Client().request(method, path, **kwargs).json()
    except ApiFailure as exc:
        raise fail(exc)


def _quotas(max_workers, max_queued_jobs, quota_mode, allow_user_code, weight=None, reserve_after_s=None) -> dict:
    given = {"max_workers": max_workers, "max_queued_jobs": max_queued_jobs, "quota_mode": quota_mode,
             "allow_user_code": allow_user_code, "weight": weight, "reserve_after_s": reserve_after_s}
    return {k: v for k, v in given.items() if v is not None}


MaxWorkers = Annotated[int | None, typer.Option(help="workers its jobs may hold at once")]
MaxQueued = Annotated[int | None, typer.Option(help="jobs it may have queued")]
QuotaMode = Annotated[str | None, typer.Option(help="over max-workers at submit: reject (429) or queue (wait)")]
UserCode = Annotated[bool | None, typer.Option("--allow-user-code/--no-user-code",
                                               help="may run model/data entrypoints")]
Weight = Annotated[float | None, typer.Option(help="fair-share weight (> 0; default 1): twice the weight, "
                                                   "twice the share")]
ReserveAfter = Annotated[float | None, typer.Option(help="seconds its first job that does not fit waits before "
                                                         "capacity is held for it (default: the server's)")]


def tenant_create(name: Annotated[str, typer.Argument(help="lower-case tenant name")],
                  max_workers: MaxWorkers = None, max_queued_jobs: MaxQueued = None,
                  quota_mode: QuotaMode = None, allow_user_code: UserCode = None, weight: Weight = None,
                  reserve_after_s: ReserveAfter = None) -> None:
    """Create a tenant and print its first API token (read + submit; shown once)."""
    tenant = _call("POST", "/v1/tenants", json={"name": name, **_quotas(max_workers, max_queued_jobs, quota_mode,
                                                                        allow_user_code, weight, reserve_after_s)})
    out.print(f"tenant {tenant['name']} ({tenant['id']}) token: {tenant['token']}")


def tenant_update(tenant: Annotated[str, typer.Argument(help="tenant id or name")],
                  max_workers: MaxWorkers = None, max_queued_jobs: MaxQueued = None,
                  quota_mode: QuotaMode = None, allow_user_code: UserCode = None, weight: Weight = None,
                  reserve_after_s: ReserveAfter = None) -> None:
    """Change a tenant's quotas, fair-share weight, reservation wait or whether it may run user code."""
    row = _call("PATCH", f"/v1/tenants/{tenant}",
                json=_quotas(max_workers, max_queued_jobs, quota_mode, allow_user_code, weight, reserve_after_s))
    out.print(json.dumps(row))


def tenant_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List tenants and their quotas."""
    rows = _call("GET", "/v1/tenants")["tenants"]
    if as_json:
        print(json.dumps(rows))
        return
    table = Table("ID", "NAME", "WEIGHT", "MAX WORKERS", "MAX QUEUED", "MODE", "RESERVE AFTER", "USER CODE", "CREATED")
    for t in rows:
        reserve = "-" if t.get("reserve_after_s") is None else f"{t['reserve_after_s']:g}s"
        table.add_row(t["id"], t["name"], f"{t.get('weight', 1):g}", str(t["max_workers"] or "-"),
                      str(t["max_queued_jobs"] or "-"), t["quota_mode"], reserve,
                      "yes" if t["allow_user_code"] else "no", (t["created_at"] or "")[:16])
    out.print(table)


def token_create(tenant: Annotated[str, typer.Argument(help="tenant id or name")],
                 name: Annotated[str, typer.Option(help="what the token is for")] = "cli",
                 scope: Annotated[list[str], typer.Option("--scope", help="read, submit or admin (repeat)")] = ["read"],  # noqa: B006
                 ttl: Annotated[int | None, typer.Option(help="seconds until it expires")] = None,
                 expires_at: Annotated[str | None, typer.Option(help="ISO time with zone when it expires")] = None,
                 as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Create an API token for a tenant; the secret is printed once."""
    body = {"tenant": tenant, "name": name, "scopes": scope,
            **({"ttl_s": ttl} if ttl else {}), **({"expires_at": expires_at} if expires_at else {})}
    row = _call("POST", "/v1/tokens", json=body)
    if as_json:
        print(json.dumps(row))
        return
    out.print(f"token {row['id']} for tenant {row['tenant_id']} scopes {','.join(row['scopes'])}"
              f"{' expires ' + row['expires_at'] if row['expires_at'] else ''}")
    print(row["token"])


def token_list(tenant: Annotated[str | None, typer.Option(help="only this tenant's (id or name)")] = None,
               as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List tokens (never their secrets)."""
    rows = _call("GET", "/v1/tokens", params={"tenant": tenant} if tenant else None)["tokens"]
    if as_json:
        print(json.dumps(rows))
        return
    table = Table("ID", "TENANT", "NAME", "SCOPES", "EXPIRES", "STATUS")
    for t in rows:
        status = "active" if t["active"] else ("revoked" if t["revoked_at"] else "expired")
        table.add_row(str(t["id"]), t["tenant_id"], t["name"], ",".join(t["scopes"]),
                      (t["expires_at"] or "-")[:19], status)
    out.print(table)


def token_revoke(token_id: Annotated[int, typer.Argument(metavar="ID")]) -> None:
    """Revoke a token (refused at once here, within TRAINYARD_AUTH_CACHE_S on other replicas)."""
    row = _call("DELETE", f"/v1/tokens/{token_id}")
    out.print(f"token {row['id']} ({row['name']}) revoked at {row['revoked_at']}")


def audit(tenant: Annotated[str | None, typer.Option(help="calls by or on this tenant")] = None,
          action: Annotated[str | None, typer.Option(help="e.g. job.submit")] = None,
          as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """The audit log of state-changing calls."""
    params = {k: v for k, v in {"tenant": tenant, "action": action}.items() if v}
    rows = _call("GET", "/v1/audit", params=params)["records"]
    if as_json:
        print(json.dumps(rows))
        return
    table = Table("TIME", "TENANT", "TOKEN", "ACTION", "TARGET", "STATUS", "DETAIL")
    for r in rows:
        table.add_row((r["ts"] or "")[:19], r["tenant_id"], f"{r['token_id']} {r['token_name']}", r["action"],
                      r["target"] or "", f"{r['status']} {r['outcome']}", r["detail"][:60])
    out.print(table)


def register_admin(app: typer.Typer) -> None:
    for name, command in (("tenant-create", tenant_create), ("tenant-list", tenant_list),
                          ("tenant-update", tenant_update), ("token-create", token_create),
                          ("token-list", token_list), ("token-revoke", token_revoke), ("audit", audit)):
        app.command(name)(command)
