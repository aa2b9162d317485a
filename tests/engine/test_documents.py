"""Attachments: every unusable file gets its own clear message; fit checks give numbers."""

import pytest

from brisk.engine.api.settings import ChatSettings
from brisk.engine.turn.documents import MAX_DOCUMENT_BYTES, DocumentError, check_fit, read_document


@pytest.mark.parametrize(
    "name, data, message",
    [
        ("empty.txt", b"", "is empty"),
        ("blank.md", b"  \n\t\n", "only whitespace"),
        ("photo.png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary file"),
        ("latin1.txt", "Zażółć".encode("latin-1", "replace") + b"\xff\xfe", "not UTF-8"),
        ("broken.pdf", b"%PDF-1.7\nthis is not really a pdf", "not a readable PDF"),
    ],
)
def test_bad_files_get_clear_messages(tmp_path, name, data, message):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(DocumentError, match=message):
        read_document(path)


def test_missing_and_huge_files(tmp_path):
    with pytest.raises(DocumentError, match="no such file"):
        read_document(tmp_path / "nope.txt")
    big = tmp_path / "big.txt"
    with open(big, "wb") as fh:
        fh.truncate(MAX_DOCUMENT_BYTES + 1)
    with pytest.raises(DocumentError, match="MiB"):
        read_document(big)


def test_text_markdown_code_and_bom(tmp_path):
    (tmp_path / "a.md").write_text("# Title\nZażółć 東京 🙂", encoding="utf-8")
    (tmp_path / "b.py").write_bytes("\ufeffdef f():\n\treturn 1\n".encode("utf-8"))
    md, code = read_document(tmp_path / "a.md"), read_document(tmp_path / "b.py")
    assert (md.kind, md.text) == ("markdown", "# Title\nZażółć 東京 🙂")
    assert (code.kind, code.text) == ("code", "def f():\n\treturn 1\n")
    assert code.as_prompt().startswith("[Attached document: b.py]\n```")


def test_pdf_text_is_extracted(tmp_path):
    pypdf = pytest.importorskip("pypdf", reason="PDF attachments need pypdf")
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

    writer = pypdf.PdfWriter()
    writer.add_blank_page(200, 200)  # a cover page without text: counted, not read
    page = writer.add_blank_page(200, 200)
    font = DictionaryObject(
        {
            NameObject("/Type"): NameObject("/Font"),
            NameObject("/Subtype"): NameObject("/Type1"),
            NameObject("/BaseFont"): NameObject("/Helvetica"),
        }
    )
    page[NameObject("/Resources")] = DictionaryObject(
        {NameObject("/Font"): DictionaryObject({NameObject("/F1"): writer._add_object(font)})}
    )
    stream = DecodedStreamObject()
    stream.set_data(b"BT /F1 12 Tf 20 100 Td (Water budget report) Tj ET")
    page[NameObject("/Contents")] = writer._add_object(stream)
    path = tmp_path / "r.pdf"
    with open(path, "wb") as fh:
        writer.write(fh)
    doc = read_document(path)
    assert doc.kind == "pdf" and "Water budget report" in doc.text and doc.pages == 2


def test_a_damaged_pdfs_library_warnings_stay_off_the_console(tmp_path, caplog):
    """pypdf (and fontTools under it) log a warning per repaired object: a long malformed PDF
    flooded stderr. Brisk reports what matters itself, in one line."""
    import logging

    pytest.importorskip("pypdf", reason="PDF attachments need pypdf")
    test_pdf_text_is_extracted(tmp_path)
    data = (tmp_path / "r.pdf").read_bytes()
    broken = data.replace(b"startxref\n", b"startxref\n9", 1)  # a wrong xref offset: pypdf repairs it, warning
    assert broken != data
    (tmp_path / "broken.pdf").write_bytes(broken)
    caplog.set_level(logging.WARNING)
    doc = read_document(tmp_path / "broken.pdf")
    assert "Water budget report" in doc.text
    assert not [r for r in caplog.records if r.name.startswith(("pypdf", "fontTools"))]


def test_fit_reports_tokens_context_and_memory(tiny_llama, tmp_path):
    (tmp_path / "d.txt").write_text("The quick brown fox. " * 40)
    doc = read_document(tmp_path / "d.txt")
    settings = ChatSettings(model="tiny-llama")
    ok = check_fit(tiny_llama, [], doc, settings, memory_available=2**30)
    assert ok.fits and ok.tokens > 100 and ok.conversation_tokens > ok.tokens
    assert ok.kv_bytes > 0
    tight = check_fit(tiny_llama, [], doc, settings, memory_available=ok.kv_bytes - 1)
    assert not tight.fits and "GiB of KV cache" in tight.reason
    long = tmp_path / "long.txt"
    long.write_text("The quick brown fox. " * 4000)
    over = check_fit(tiny_llama, [], read_document(long), settings, memory_available=2**40)
    assert not over.fits and f"holds {tiny_llama.context_length:,}" in over.reason


def test_fit_plans_with_the_chats_key_and_value_bits(tmp_path):
    """K8/V4 needs (8/8 + 4/32 + 4/8 + 4/32) / (2·2) of float16 KV per token; `auto` plans
    with what the model's self-test chose, and with 16 bits before it has run."""
    from brisk.engine.kv import fidelity
    from brisk.engine.models.loader import load_folder
    from tests.tiny_models import make_tiny_model

    lm = load_folder(make_tiny_model(tmp_path / "m", "llama", hidden_size=256))  # head_dim 64
    (tmp_path / "d.txt").write_text("The quick brown fox. " * 40)
    doc = read_document(tmp_path / "d.txt")
    need = lambda **kw: check_fit(lm, [], doc, ChatSettings(model="m", **kw), memory_available=2**40).kv_bytes  # noqa: E731
    dense = need()
    assert need(k_bits=8, v_bits=4) == pytest.approx(dense * (1 + 0.125 + 0.5 + 0.125) / 4)
    assert need(kv_auto=True) == dense
    fidelity.FidelityStore(lm.path).save(
        {
            "K4/V4 g32": {"top1_agreement": 0.9, "mean_kl": 0.2, "generated": 64, "passed": False, "why": "-"},
            "K8/V4 g32": {"top1_agreement": 1.0, "mean_kl": 0.0, "generated": 64, "passed": True, "why": "-"},
        }
    )
    assert need(kv_auto=True) == need(k_bits=8, v_bits=4)


def test_attached_documents_split_back_out_of_a_message_exactly():
    """The bubble shows a sent message's documents as chips: the split must invert the join,
    whatever fences the documents themselves hold."""
    from brisk.engine.turn.documents import join_attached, split_attached

    documents = [("a.txt", "one\n\ntwo"), ("b.md", "has ``` inside\n~~~~\nand tildes"), ("c.py", "x = 1")]
    for text in ("What changed?", "", "Line one\n\n[Attached document: fake] in my own words"):
        assert split_attached(join_attached(documents, text)) == (documents, text)
    assert split_attached("No documents here.") == ([], "No documents here.")
