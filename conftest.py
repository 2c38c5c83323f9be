"""What the tests share: the tiny model saved once a session. The markers are in pytest.ini."""
import json

import pytest

import fgrpo


@pytest.fixture(scope="session")
def tiny_saved(tmp_path_factory):
    """The tiny demo's warm-started model and tokenizer as an HF folder, its 2,000 training
    problems and 64 held-out ones as JSONL: built once for every test that needs them."""
    root = tmp_path_factory.mktemp("tiny")
    model, tok, problems, held_out = fgrpo.build_tiny(0)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    for name, rows in (("train", problems), ("held_out", held_out)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(p) + "\n" for p in rows))
    return root
