from __future__ import annotations

import pytest

from agent.domain.task import normalize_subject


@pytest.mark.parametrize(
    ("subject", "title"),
    [
        ("Re: Invoice 118", "Invoice 118"),
        ("RE: Fwd: FW: Invoice 118", "Invoice 118"),
        ("Re[2]: Invoice", "Invoice"),
        ("AW: WG: Rechnung", "Rechnung"),
        ("TR: RE : Facture", "Facture"),
        ("SV: Faktura", "Faktura"),
        ("RV: Factura", "Factura"),
        ("השב: בקשה לעדכון", "בקשה לעדכון"),
        ("הועבר: בקשה", "בקשה"),
        ("رد: طلب", "طلب"),
        ("回复：发票", "发票"),
        ("  Re:   many    spaces\there  ", "many spaces here"),
        ("[EXTERNAL] Re: Contract", "Contract"),
        ("Re:", "(no subject)"),
        ("", "(no subject)"),
        ("Regarding the renewal", "Regarding the renewal"),
        ("Reply needed: contract", "Reply needed: contract"),
    ],
)
def test_the_title_strips_reply_and_forward_prefixes_and_folds_whitespace(
    subject: str, title: str
) -> None:
    assert normalize_subject(subject) == title
