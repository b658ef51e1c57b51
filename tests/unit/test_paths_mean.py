"""Paths mean what they say (issue #37): an image that exists but is no regular file (a folder, a FIFO, /dev/zero)
is told apart from a missing one and never opened; a URL of any scheme is refused as a URL (`file:///etc/passwd`
was read as a relative path); a symlink that leads out of the data folder is refused, named as written; a GGUF (or
any binary file) given where a recipe is read is named as what it is."""

from __future__ import annotations

import os

import pytest

from ftune.datafiles.images import ImageProblem, _resolve, open_image
from ftune.errors import UsageError
from ftune.recipe.schema import ImageSettings

FIT = ImageSettings()


@pytest.mark.parametrize(("make", "kind"), [
    (lambda p: p.mkdir(), "a folder"),
    (lambda p: os.mkfifo(p), "a named pipe (FIFO)"),
    (None, "a character device"),
])
def test_an_image_that_is_not_a_regular_file(tmp_path, make, kind):
    path = tmp_path / "img.png"
    if make is None:
        path = "/dev/zero"
    else:
        make(path)
    with pytest.raises(ImageProblem) as err:
        open_image(str(path), FIT, "messages[0].content[0].image")
    assert err.value.message == f"image {path} exists but is {kind}, not a regular file"
    with pytest.raises(ImageProblem, match="does not exist"):
        open_image(str(tmp_path / "gone.png"), FIT)


@pytest.mark.parametrize("url", ["file:///etc/passwd", "https://x/cat.png", "s3://bucket/cat.png", "FTP://h/a.png"])
def test_urls_of_any_scheme_are_refused_as_urls(tmp_path, url):
    with pytest.raises(ImageProblem) as err:
        _resolve(url, tmp_path, "messages[0].content[0].image")
    assert err.value.message.startswith(f"image {url} is a URL")


def test_a_symlink_out_of_the_data_folder_is_refused_named_as_written(tmp_path):
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "key.png").write_bytes(b"x")
    data = tmp_path / "data"
    data.mkdir()
    (data / "cat.png").symlink_to(outside / "key.png")
    (data / "dog.png").write_bytes(b"x")
    (data / "alias.png").symlink_to(data / "dog.png")
    with pytest.raises(ImageProblem) as err:
        _resolve("cat.png", data, "messages[0].content[0].image")
    assert err.value.message == f"image cat.png is a symlink that leads out of the data folder {data}"
    assert "secret" not in err.value.message + (err.value.hint or "")
    assert _resolve("alias.png", data, "f") == str(data / "alias.png")  # a link that stays inside is fine
    assert _resolve(str(outside / "key.png"), data, "f") == str(outside / "key.png")  # an absolute path as written


@pytest.mark.parametrize(("content", "what"), [(b"GGUF\x03\x00\x00\x00" + bytes(64), "a GGUF model file"),
                                               (b"\x10\x00\x00\x00\x00\x00\x00\x00{}", "a binary file")])
def test_a_model_file_where_a_recipe_is_read_is_named(tmp_path, content, what):
    from ftune.infer.source import resolve

    (tmp_path / "x.gguf").write_bytes(content)
    with pytest.raises(UsageError) as err:
        resolve(str(tmp_path / "x.gguf"), allow_model=True)
    assert err.value.message == f"{tmp_path / 'x.gguf'} is {what}, not a recipe"


def test_a_data_path_that_is_a_url_is_refused_as_one(tmp_path, monkeypatch):
    from ftune.plan.checks.paths import missing_inputs
    from ftune.recipe import load_recipe

    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.yaml").write_text("name: u\nmodel: {path: m}\ndata: {train: [{path: 'file:///etc/passwd'}]}\n"
                                     "train: {max_steps: 1}\n")
    (problem,) = [p for p in missing_inputs(load_recipe("r.yaml").recipe, model_folder=False)]
    assert problem.path == "data.train[0].path"
    assert problem.message.startswith("file:///etc/passwd is a URL: data paths are local files")
