"""The download directory on its own (api.downloads): names, the finished/being-made states, and
the age and size bounds that keep it from filling the disk."""

from __future__ import annotations

import os
import time

import pytest

from api.downloads import DownloadStore, SharedDownloads
from api.errors import ApiError


def age(path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_file_is_being_made_then_found_then_gone_after_its_age(tmp_path):
    store = DownloadStore(tmp_path / "d", max_age_s=60, max_bytes=1 << 20)
    file = store.create("mp3")
    assert file.link == "/download/" + file.name and file.name.endswith(".mp3") and len(file.name) == 36
    with pytest.raises(ApiError) as e:
        store.find(file.name)
    assert (e.value.status, e.value.code) == (409, "download_not_ready")
    file.save(b"audio bytes")
    assert store.find(file.name).read_bytes() == b"audio bytes"
    assert not list(store.directory.glob("*.part"))
    age(store.directory / file.name, 61)
    with pytest.raises(ApiError) as e:
        store.find(file.name)
    assert (e.value.status, e.value.code) == (404, "download_not_found")
    store.create("wav")  # a new download clears what has expired
    assert not (store.directory / file.name).exists()


def test_discarded_and_unknown_names_are_not_found(tmp_path):
    store = DownloadStore(tmp_path, max_age_s=60, max_bytes=1 << 20)
    file = store.create("wav")
    file.discard()
    for name in (file.name, "speech.wav", "../" + file.name, file.name.upper(), file.name[:-3] + "exe"):
        with pytest.raises(ApiError) as e:
            store.find(name)
        assert e.value.status == 404, name


def test_oldest_finished_files_go_first_when_over_the_size_bound(tmp_path):
    store = DownloadStore(tmp_path, max_age_s=3600, max_bytes=2500)
    files = []
    for i in range(3):
        f = store.create("pcm")
        f.save(bytes(1000))
        age(tmp_path / f.name, 100 - i)  # the first is the oldest
        files.append(f)
    making = store.create("pcm")  # 3000 bytes > 2500: the oldest goes; one being made is never counted
    assert [(tmp_path / f.name).exists() for f in files] == [False, True, True]
    assert (tmp_path / (making.name + ".part")).exists()


def test_unfinished_files_of_a_dead_worker_expire_too(tmp_path):
    store = DownloadStore(tmp_path, max_age_s=60, max_bytes=1 << 20)
    orphan = store.create("opus")
    age(tmp_path / (orphan.name + ".part"), 61)
    store.create("opus")
    assert not (tmp_path / (orphan.name + ".part")).exists()
    with pytest.raises(ApiError) as e:
        store.find(orphan.name)
    assert e.value.status == 404


def test_a_fleet_of_several_machines_shares_its_downloads_through_redis(tmp_path, redis_server):
    """Two machines (two download directories) on one Redis: the link works on either; a file over
    the shared size only on its own machine; a discarded one nowhere."""
    import asyncio

    from api.speech.redis_link import connect

    async def go():
        client = connect(redis_server.url)
        try:
            shared = SharedDownloads(client, max_bytes=1000, max_age_s=60, prefix="{test}")
            maker = DownloadStore(tmp_path / "a", max_age_s=60, max_bytes=1 << 20, shared=shared)
            other = DownloadStore(tmp_path / "b", max_age_s=60, max_bytes=1 << 20, shared=shared)
            file = await maker.start("mp3")
            with pytest.raises(ApiError) as e:
                await other.lookup(file.name)
            assert (e.value.status, e.value.code) == (409, "download_not_ready")
            await file.finish(b"audio bytes")
            assert (await maker.lookup(file.name)).read_bytes() == b"audio bytes"  # its own file
            assert await other.lookup(file.name) == b"audio bytes"  # from Redis
            big = await maker.start("wav")
            await big.finish(bytes(1001))
            with pytest.raises(ApiError) as e:
                await other.lookup(big.name)
            assert e.value.status == 404 and "KOKORO_DOWNLOAD_SHARED_MAX_MIB" in e.value.message
            gone = await maker.start("wav")
            gone.discard()
            await asyncio.sleep(0.1)  # the shared mark goes in the background
            with pytest.raises(ApiError) as e:
                await other.lookup(gone.name)
            assert e.value.status == 404
            assert await client.ttl(f"{{test}}:download:{file.name}") > 0  # expires with the files
        finally:
            await client.aclose()

    asyncio.run(go())


@pytest.mark.parametrize("url, shared", [
    ("", False), ("redis://127.0.0.1:6379/0", False), ("redis://localhost:6379", False),
    ("unix:///tmp/kokoro-redis/redis.sock?db=0", False), ("redis://[::1]:6379", False),
    ("rediss://default:secret@my-redis.example.com:6380/0", True), ("redis://10.0.0.5:6379", True),
])
def test_downloads_are_shared_only_where_redis_is_another_machines(url, shared):
    assert (SharedDownloads.for_fleet(url, 1 << 20, 60) is not None) == shared
    assert SharedDownloads.for_fleet(url, 0, 60) is None
