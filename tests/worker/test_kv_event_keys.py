"""CURVE key files: generation layout and permissions, loading, and a clear error for each unusable input."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from sgl_moe.kv_event_keys import KeyFileError, generate, load_client_keys, load_server_keys, main


def test_generate_makes_one_folder_per_side_with_private_secrets(tmp_path):
    worker_dir, router_dir = generate(str(tmp_path / "keys"))
    assert sorted(p.name for p in worker_dir.iterdir()) == ["router.key", "worker.key_secret"]
    assert sorted(p.name for p in router_dir.iterdir()) == ["router.key_secret", "worker.key"]
    for secret in (worker_dir / "worker.key_secret", router_dir / "router.key_secret"):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    server, client = load_server_keys(str(worker_dir)), load_client_keys(str(router_dir))
    assert client.server == server.public and server.clients == {client.public}
    assert len(server.secret) == len(client.secret) == 40  # Z85 of 32 bytes


def test_generate_never_overwrites(tmp_path, capsys):
    generate(str(tmp_path / "keys"))
    before = (tmp_path / "keys" / "worker" / "worker.key_secret").read_bytes()
    assert main([str(tmp_path / "keys")]) == 2
    assert "not overwriting" in capsys.readouterr().err
    assert (tmp_path / "keys" / "worker" / "worker.key_secret").read_bytes() == before


def test_command_line_prints_the_flags_to_pass(tmp_path):
    out = subprocess.run([sys.executable, "-m", "sgl_moe.kv_event_keys", str(tmp_path / "k")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"--moe-kv-events-keys {tmp_path / 'k' / 'worker'}" in out.stdout
    assert f"--kv-events-keys {tmp_path / 'k' / 'router'}" in out.stdout


def test_more_routers_are_more_public_keys_in_the_worker_folder(tmp_path):
    worker_dir, _ = generate(str(tmp_path / "a"))
    _, other_router = generate(str(tmp_path / "b"))
    (worker_dir / "second-router.key").write_bytes((other_router.parent / "worker" / "router.key").read_bytes())
    assert len(load_server_keys(str(worker_dir)).clients) == 2


@pytest.mark.parametrize("damage, needle", [
    (lambda w, r: os.chmod(w / "worker.key_secret", 0o644), "chmod 600"),
    (lambda w, r: (w / "worker.key_secret").unlink(), "does not exist"),
    (lambda w, r: (w / "router.key").unlink(), "no client public key"),
    (lambda w, r: (w / "router.key").write_text("not a certificate\n"), "not a ZeroMQ public certificate"),
    (lambda w, r: (w / "worker.key_secret").write_text("junk\n"), "not a ZeroMQ secret certificate"),
])
def test_unusable_worker_folder_is_named(tmp_path, damage, needle):
    worker_dir, router_dir = generate(str(tmp_path / "keys"))
    damage(worker_dir, router_dir)
    with pytest.raises(KeyFileError, match=needle):
        load_server_keys(str(worker_dir))


def test_unusable_router_folder_is_named(tmp_path):
    _, router_dir = generate(str(tmp_path / "keys"))
    (router_dir / "worker.key").unlink()
    with pytest.raises(KeyFileError, match="worker.key does not exist"):
        load_client_keys(str(router_dir))
    with pytest.raises(KeyFileError, match="is not a directory"):
        load_client_keys(str(tmp_path / "missing"))
