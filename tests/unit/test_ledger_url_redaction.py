"""A PostgreSQL ledger URL's password never reaches a message (issue 43, class 5), in every form libpq reads one:
`user:PASS@`, an empty user, an `@` left unencoded, a bad `%` escape (psycopg echoes the token), `?password=`. The
ledger is opened for real (psycopg, a Unix socket directory that does not exist: no network, no server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.ledger import pg

try:  # imported here, outside the lane guard (it looks for libpq with ldconfig)
    import psycopg
except ImportError:  # pragma: no cover - the [postgresql] extra not installed
    psycopg = None

SECRET = "Sup3rSecretPw"
NOSOCK = "host=/nonexistent-provisioner-pg"
FORMS = {
    "user and password": f"postgresql://ledger:{SECRET}@/prov?{NOSOCK}",
    "empty user": f"postgresql://:{SECRET}@/prov?{NOSOCK}",
    "query password": f"postgresql://ledger@/prov?{NOSOCK}&password={SECRET}",
    "query password, key encoded": f"postgres://ledger@/prov?{NOSOCK}&%70assword={SECRET}",
    "unencoded @": f"postgresql://ledger:{SECRET[:6]}@{SECRET[6:]}@/prov?{NOSOCK}",
    "bad % escape": f"postgresql://ledger:{SECRET[:6]}%zz{SECRET[6:]}@/prov?{NOSOCK}",
    "bad % escape in the query": f"postgresql://ledger@/prov?{NOSOCK}&password={SECRET[:6]}%zz{SECRET[6:]}",
    "sslpassword": f"postgresql://ledger@/prov?{NOSOCK}&sslpassword={SECRET}",
}


def _leaks(text: str) -> list[str]:
    return [p for p in (SECRET, SECRET[:6], SECRET[6:]) if p in text]


@pytest.mark.parametrize("form", FORMS)
def test_redact_hides_the_password_in_every_form(form: str) -> None:
    url = FORMS[form]
    shown = pg.redact(url)
    assert _leaks(shown) == [], shown
    assert "***" in shown and "/prov" in shown  # still says which ledger


@pytest.mark.parametrize("form", FORMS)
def test_opening_the_ledger_fails_in_one_line_without_the_password(form: str) -> None:
    if psycopg is None:
        pytest.skip("psycopg not installed (pip install 'provisioner[postgresql]')")
    from provisioner.ledger import Ledger, LedgerError

    with pytest.raises(LedgerError) as err:
        Ledger.open(FORMS[form], timeout=2)
    msg = str(err.value)
    assert _leaks(msg) == [] and "\n" not in msg, msg
    assert msg.startswith("cannot open the ledger postgres")


def test_a_driver_message_echoing_a_piece_of_the_password_is_scrubbed() -> None:
    url = f"postgresql://u:{SECRET[:2]}@{SECRET[2:]}@db.example/prov"  # libpq: password "Su", host "p3rSecretPw@..."
    msg = f'could not translate host name "{SECRET[2:]}@db.example" to address: Name or service not known'
    out = pg.scrub(msg, url)
    assert SECRET[2:] not in out and '"***@db.example"' in out and "translate host name" in out


def test_the_recorder_warning_is_scrubbed(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from provisioner.ledger.record import warn

    url = FORMS["bad % escape"]
    warn(RuntimeError(f'invalid percent-encoded token: "{SECRET[:6]}%zz{SECRET[6:]}"'), url)
    assert _leaks(capsys.readouterr().err) == []
