"""loader/ is four packages (format/, engine/, tp/, load/), each with a README covering every header
in it, and loader/README.md an index naming them and loader/errors.h (issue 13). Torch-free."""
import glob
import os

from conftest import ROOT

PACKAGES = ("format", "engine", "tp", "load")


def test_every_loader_header_is_named_in_its_folders_readme():
    folders = {os.path.dirname(h) for h in glob.glob(os.path.join(ROOT, "loader", "**", "*.h"),
                                                      recursive=True)}
    assert folders == {os.path.join(ROOT, "loader")} | {
        os.path.join(ROOT, "loader", p) for p in PACKAGES}, sorted(folders)
    missing = []
    for folder in sorted(folders):
        with open(os.path.join(folder, "README.md"), encoding="utf-8") as f:
            readme = f.read()
        missing += [os.path.relpath(h, ROOT) for h in sorted(glob.glob(os.path.join(folder, "*.h")))
                    if f"`{os.path.basename(h)}`" not in readme]
    assert missing == [], "headers no README describes: " + ", ".join(missing)


def test_the_loader_index_links_every_package():
    with open(os.path.join(ROOT, "loader", "README.md"), encoding="utf-8") as f:
        index = f.read()
    for p in PACKAGES:
        assert f"({p}/README.md)" in index, p
