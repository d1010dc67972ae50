"""Key store: enrolment, rotation with two active keys, revocation, file modes, no key in output."""

from __future__ import annotations

import os
import stat

import pytest

from kernel_insight.collector import keys as k


@pytest.fixture
def store(tmp_path):
    return k.KeyStore(tmp_path / "keys.json")


def test_added_agent_key_is_found_and_file_is_private(store, tmp_path):
    creds = store.add_agent("host-1/gpu0")
    assert store.key_for(creds.agent_id, 1) == creds.key
    assert stat.S_IMODE(os.stat(tmp_path / "keys.json").st_mode) == 0o600
    kf = tmp_path / "agent.key"
    creds.write_key_file(kf)
    assert stat.S_IMODE(os.stat(kf).st_mode) == 0o600
    assert k.read_key_file(kf) == creds


def test_rotation_keeps_two_active_keys(store):
    c1 = store.add_agent("a")
    c2 = store.rotate(c1.agent_id)
    assert store.key_for(c1.agent_id, 1) == c1.key
    assert store.key_for(c1.agent_id, 2) == c2.key
    c3 = store.rotate(c1.agent_id)
    assert c3.key_id == 3
    with pytest.raises(k.UnknownAgent, match="no active key 1"):
        store.key_for(c1.agent_id, 1)
    assert store.key_for(c1.agent_id, 3) == c3.key
    (info,) = store.agents()
    assert info.active_key_ids == (2, 3)
    assert info.retired_key_ids == (1,)


def test_retire_and_revoke(store):
    c = store.add_agent("a")
    store.rotate(c.agent_id)
    store.retire(c.agent_id, 2)
    with pytest.raises(k.UnknownAgent):
        store.key_for(c.agent_id, 2)
    store.revoke(c.agent_id)
    with pytest.raises(k.RevokedAgent):
        store.key_for(c.agent_id, 1)
    with pytest.raises(k.RevokedAgent):
        store.rotate(c.agent_id)


def test_unknown_agent(store):
    with pytest.raises(k.UnknownAgent, match="not enrolled"):
        store.key_for(bytes(16), 1)


def test_running_reader_sees_revocation_made_by_another_writer(store, tmp_path, monkeypatch):
    monkeypatch.setattr("kernel_insight.collector.private_json.RELOAD_CHECK_S", 0.0)
    c = store.add_agent("a")
    assert store.key_for(c.agent_id, 1) == c.key
    k.KeyStore(tmp_path / "keys.json").revoke(c.agent_id)
    with pytest.raises(k.RevokedAgent):
        store.key_for(c.agent_id, 1)


def test_world_readable_store_is_refused(store, tmp_path):
    store.add_agent("a")
    os.chmod(tmp_path / "keys.json", 0o644)
    with pytest.raises(k.KeyStoreError, match="chmod 600"):
        k.KeyStore(tmp_path / "keys.json")


def test_corrupt_store_is_a_clear_error(tmp_path):
    p = tmp_path / "keys.json"
    p.write_text("{nope")
    os.chmod(p, 0o600)
    with pytest.raises(k.KeyStoreError, match="corrupt"):
        k.KeyStore(p)


def test_key_never_in_repr_errors_or_cli_output(store, tmp_path, capsys):
    from kernel_insight.cli import main

    creds = store.add_agent("a")
    assert creds.key.hex() not in repr(creds)
    kf = tmp_path / "out.key"
    assert main(["keys", "add", "b", "--store", str(tmp_path / "keys.json"), "--key-file", str(kf)]) == 0
    assert main(["keys", "list", "--store", str(tmp_path / "keys.json")]) == 0
    assert main(["keys", "list", "--json", "--store", str(tmp_path / "keys.json")]) == 0
    assert (
        main(
            [
                "keys",
                "rotate",
                creds.agent_id.hex(),
                "--store",
                str(tmp_path / "keys.json"),
                "--key-file",
                str(tmp_path / "r.key"),
            ]
        )
        == 0
    )
    assert main(["keys", "revoke", "00" * 16, "--store", str(tmp_path / "keys.json")]) == 1
    out = capsys.readouterr()
    new = k.read_key_file(kf)
    rotated = k.read_key_file(tmp_path / "r.key")
    for secret in (creds.key.hex(), new.key.hex(), rotated.key.hex()):
        assert secret not in out.out
        assert secret not in out.err
    assert "not enrolled" in out.err
    assert new.agent_id.hex() in out.out


def test_bad_agent_id_text():
    with pytest.raises(k.KeyStoreError, match="32 hex"):
        k.parse_agent_id("xyz")


def test_one_agent_is_shown_without_its_keys(store):
    c = store.add_agent("host-2/gpu1")
    info = store.agent(c.agent_id)
    assert info.name == "host-2/gpu1"
    assert info.active_key_ids == (1,)
    assert c.key.hex() not in repr(info)
    assert c.key.hex() not in repr(store)
    with pytest.raises(k.UnknownAgent, match="not enrolled"):
        store.agent(bytes(16))


@pytest.mark.parametrize("name", ["", "a\nb", "x" * 201, "nul\0"])
def test_bad_agent_names_are_refused_before_anything_is_written(store, tmp_path, name):
    with pytest.raises(k.KeyStoreError, match="1-200 characters"):
        store.add_agent(name)
    assert not (tmp_path / "keys.json").exists()


def test_a_fleet_is_enrolled_in_one_edit_each_agent_with_its_own_key(store, tmp_path):
    fleet = store.add_agents([f"gpu-{i}" for i in range(50)], {"rack": "r1"})
    assert len({c.agent_id for c in fleet}) == len({c.key for c in fleet}) == 50
    reread = k.KeyStore(tmp_path / "keys.json")
    for i, c in enumerate(fleet):
        assert reread.key_for(c.agent_id, 1) == c.key
        assert reread.agent(c.agent_id).name == f"gpu-{i}"
    assert reread.labels_of(fleet[7].agent_id.hex()) == {"rack": "r1"}
    with pytest.raises(k.KeyStoreError, match="1-200 characters"):
        store.add_agents(["fine", ""])
    assert len(reread.agents()) == 50  # a bad name anywhere: none of the batch is written


def test_store_urls_are_told_from_paths():
    assert k.is_store_url("http://ch:8123")
    assert k.is_store_url("chdb://./d")
    assert not k.is_store_url("ki-data/keys.json")
    assert not k.is_store_url("./http://odd")


@pytest.mark.parametrize(
    "args",
    [["list"], ["list", "--json"], ["rotate", "00" * 16], ["retire", "00" * 16, "1"], ["revoke", "00" * 16]],
)
def test_keys_commands_name_a_store_path_that_does_not_exist(tmp_path, capsys, args):
    """``ki keys list --store /missing`` printed nothing and exited 0: an absent file read as an
    empty store. Only add-agent may start a store; the rest name the path and exit 1."""
    from kernel_insight.cli import main

    store = tmp_path / "missing" / "keys.json"
    assert main(["keys", *args, "--store", str(store)]) == 1
    out = capsys.readouterr()
    assert (out.out, out.err) == ("", f"ki keys: key store {store} does not exist\n")
    assert not (tmp_path / "missing").exists()  # nothing made on the way (rotate used to mkdir it)


def test_keys_list_names_a_store_that_is_a_directory_or_not_a_key_store(tmp_path, capsys):
    from kernel_insight.cli import main

    assert main(["keys", "list", "--store", str(tmp_path)]) == 1
    assert capsys.readouterr().err == f"ki keys: key store {tmp_path} is not a file\n"
    other = tmp_path / "tokens.json"
    other.write_text('{"version": 1, "tokens": []}')
    other.chmod(0o600)
    assert main(["keys", "list", "--store", str(other)]) == 1
    # another kind of store is named as such, not as a damaged key store ("is corrupt (KeyError)")
    assert capsys.readouterr().err == (
        f"ki keys: key store {other} is not a key store: expected a JSON object "
        '{"version": 1, "agents": [...]}\n'
    )
    for text in ("[]", '"keys"', '{"version": 1}'):  # JSON, but no store of any kind
        other.write_text(text)
        assert main(["keys", "list", "--store", str(other)]) == 1
        assert capsys.readouterr().err.endswith(
            'is not a key store: expected a JSON object {"version": 1, "agents": [...]}\n'
        )
    other.write_text('{"version": 1, "agents": [{"name": "no id"}]}')  # a key store, damaged
    assert main(["keys", "list", "--store", str(other)]) == 1
    assert capsys.readouterr().err == f"ki keys: key store {other} is corrupt (KeyError)\n"


def test_keys_list_of_an_existing_empty_store_is_empty(tmp_path, capsys):
    from kernel_insight.cli import main

    path = tmp_path / "keys.json"
    c = k.KeyStore(path).add_agent("a")
    with k.KeyStore(path)._editing() as agents:
        agents.pop(c.agent_id)
    assert main(["keys", "list", "--store", str(path)]) == 0
    assert main(["keys", "list", "--json", "--store", str(path)]) == 0
    assert capsys.readouterr() == ("[]\n", "")  # the plain listing printed nothing


def test_keys_list_names_a_store_it_cannot_read(store, tmp_path, capsys, monkeypatch):
    """(As root every file reads, so the refusal is made here.) One line naming the store, not an errno repr."""
    from pathlib import Path

    from kernel_insight.cli import main

    store.add_agent("a")

    def refuse(self: Path, *args: object, **kw: object) -> str:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_text", refuse)
    assert main(["keys", "list", "--store", str(tmp_path / "keys.json")]) == 1
    assert (
        capsys.readouterr().err
        == f"ki keys: key store {tmp_path / 'keys.json'} cannot be read: Permission denied\n"
    )
