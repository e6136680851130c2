"""The audit-log sanitizer: each PII type becomes its placeholder, look-alikes stay, validators are exact, an
identifier introduced by its label is masked even when it fails its validator, and the labelled sets
(tests/data/pii_eval.jsonl, tests/data/pii_labelled.jsonl) meet the recall targets with their look-alike rows left
alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshlm.serve.recognizers import iban_ok, luhn_ok, ssn_ok
from meshlm.serve.recognizers_keys import looks_random, looks_secret
from meshlm.serve.sanitize import PII_TYPES, find_pii, sanitize

EVAL_SET = Path(__file__).parent / "data" / "pii_eval.jsonl"
LABELLED_SET = Path(__file__).parent / "data" / "pii_labelled.jsonl"

PII = [  # (text, raw value that must disappear, placeholder that must appear)
    ("write to lena.fischer@example.org today", "lena.fischer@example.org", "<EMAIL>"),
    ("her address is omar [at] example [dot] net", "omar [at] example [dot] net", "<EMAIL>"),
    ("call (646) 555-0134 tonight", "(646) 555-0134", "<PHONE>"),
    ("mobile +44 7911 123456", "+44 7911 123456", "<PHONE>"),
    ("office 030 1234 5678 in Berlin", "030 1234 5678", "<PHONE>"),
    ("card 5555 5555 5555 4444 exp 01/29", "5555 5555 5555 4444", "<CREDIT_CARD>"),
    ("amex 3782-822463-10005", "3782-822463-10005", "<CREDIT_CARD>"),
    ("pay to GB29 NWBK 6016 1331 9268 19 please", "GB29 NWBK 6016 1331 9268 19", "<IBAN>"),
    ("iban NL91ABNA0417164300", "NL91ABNA0417164300", "<IBAN>"),
    ("blocked 198.51.100.23 at noon", "198.51.100.23", "<IP_ADDRESS>"),
    ("v6 host 2001:db8::ff00:42:8329 is up", "2001:db8::ff00:42:8329", "<IP_ADDRESS>"),
    ("SSN 219-09-9999 on file", "219-09-9999", "<US_SSN>"),
    ("my social security number is 219099999", "219099999", "<US_SSN>"),
    ("key sk-abcdefghijklmnop1234567890ABCD", "sk-abcdefghijklmnop1234567890ABCD", "<API_KEY>"),
    ("AWS key AKIAJ2EXAMPLE7QWERTY", "AKIAJ2EXAMPLE7QWERTY", "<API_KEY>"),
    ("GITHUB_TOKEN=ghp_aB3dE5fG7hI9jK1lM3nO5pQ7rS9tU1vW3xY5", "ghp_aB3dE5fG7hI9jK1lM3nO5pQ7rS9tU1vW3xY5", "<API_KEY>"),
    ("secret: 9fK2pL8qR4sT7vW1xZ3y", "9fK2pL8qR4sT7vW1xZ3y", "<API_KEY>"),
    ("the password is Sunshine#42", "Sunshine#42", "<API_KEY>"),
    ("Thanks for the help, my name is Greta Lindqvist.", "Greta Lindqvist", "<PERSON>"),
    ("Dear Dr. Obi, the results are in.", "Obi", "<PERSON>"),
    ("I talked to Mateo Rossi about it", "Mateo Rossi", "<PERSON>"),
    ("Kind regards,\nHelga Brandt", "Helga Brandt", "<PERSON>"),
    ("Applicant: OKAFOR CHINEDU", "OKAFOR CHINEDU", "<PERSON>"),
    ("approved by J. Kowalski today", "J. Kowalski", "<PERSON>"),
    ("Nowak, Anna asked for a refund", "Nowak", "<PERSON>"),
    ("our colleague Bartholomew Quist signed", "Bartholomew Quist", "<PERSON>"),
    ("please ask Aiyana to review it", "Aiyana", "<PERSON>"),
    ("we moved to 1234 Sunset Boulevard, Los Angeles, CA 90028", "1234 Sunset Boulevard", "<STREET_ADDRESS>"),
    ("drop it at 8 Chestnut Close", "8 Chestnut Close", "<STREET_ADDRESS>"),
    ("wohnt in der Lindenstraße 14", "Lindenstraße 14", "<STREET_ADDRESS>"),
    ('{"shipping_address": "Plot 42, Ikoyi Crescent, Lagos"}', "Plot 42, Ikoyi Crescent, Lagos", "<STREET_ADDRESS>"),
    ("born on 14 July 1989 in Lyon", "14 July 1989", "<DATE_OF_BIRTH>"),
    ("DOB 1992-02-29", "1992-02-29", "<DATE_OF_BIRTH>"),
]

LOOK_ALIKES = [
    "pip install torch==2.13.0 then upgrade to version 1.4.2.7",
    "fixed in commit 9fceb02d0ae598e95dc970b74767f19372d61af8",
    "request 3fa85f64-5717-4562-b3fc-2c963f66afa6 timed out",
    "the release is planned for 2025-06-30 and the review for 07/15/2025",
    "order #5019-7170-1010 shipped; tracking 1Z12345E0205271688",
    "4111 1111 1111 1112 fails the Luhn check",
    "GB00 NWBK 6016 1331 9268 19 has wrong check digits",
    "666-45-1234 and 000-12-3456 are never issued",
    "the token count is 4096 and the api key is required",
    "the model has 7,241,732,096 parameters and 32 layers",
    "Will the May release ship before June?",
    "Ask Google. email Support. My To Do List. We read Le Monde. Let me know.",
    "see section 2.3.1.4 of the spec",
    "the MAC is 3c:22:fb:91:0a:7e and the time is 10:42:17",
    "Python 3.11 and CUDA 12.4 on Ubuntu 22.04",
    "The Eiffel Tower is in Paris, France.",
    "sha256 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "MAC address: 00:1A:2B:3C:4D:5E; memory address: 0x7ffee4b1c9a8; confirm your address: it is required",
    "card ending in 4242; the card game has 52 cards; passport photos are 35x45 mm",
    "The license is Apache 2.0. Routing table has 1024 entries. Account 3 of 12 processed.",
    "account created 2021-03-04T10:00:00Z; the passport office opens at 09:30; SSN checks took 1234 ms",
]

LABELLED_INVALID = [  # (text, value that fails its validator but is introduced by its label, placeholder)
    ("My SSN is 987-65-4321.", "987-65-4321", "<US_SSN>"),  # area 9xx is never issued
    ("SSN 666-45-1234 and SSN 000-12-3456", "000-12-3456", "<US_SSN>"),
    ("card 4111 1111 1111 1112 fails the Luhn check", "4111 1111 1111 1112", "<CREDIT_CARD>"),
    ("4111 1111 1111 1112 is my card number", "4111 1111 1111 1112", "<CREDIT_CARD>"),
    ("iban GB00 NWBK 6016 1331 9268 19 has wrong check digits", "GB00 NWBK 6016 1331 9268 19", "<IBAN>"),
    ("Routing number 021000022, account 4820 1193 77", "4820 1193 77", "<ACCOUNT_NUMBER>"),
    ("Routing number 021000022, account 4820 1193 77", "021000022", "<ACCOUNT_NUMBER>"),
    ("passport no. is C03005988", "C03005988", "<PASSPORT>"),
    ("driver's licence # WX-445-812-09", "WX-445-812-09", "<DRIVER_LICENSE>"),
    ("mobile: +0 415 555 2671", "+0 415 555 2671", "<PHONE>"),
    ("my TIN is 900-70-0000", "900-70-0000", "<TAX_ID>"),
]


@pytest.mark.parametrize("text,raw,placeholder", PII, ids=[p[2] + str(i) for i, p in enumerate(PII)])
def test_pii_is_replaced_by_its_placeholder(text, raw, placeholder):
    clean = sanitize(text)
    assert raw not in clean and placeholder in clean, clean


@pytest.mark.parametrize("text,raw,placeholder", LABELLED_INVALID,
                         ids=[p[2] + str(i) for i, p in enumerate(LABELLED_INVALID)])
def test_an_identifier_after_its_label_is_masked_even_when_invalid(text, raw, placeholder):
    clean = sanitize(text)
    assert raw not in clean and placeholder in clean, clean


def test_validators_still_decide_without_a_label():
    assert sanitize("my SSN is 987-65-4321") == "my SSN is <US_SSN>"
    unlabelled = "the numbers 987-65-4321 and 4111 1111 1111 1112"
    assert sanitize(unlabelled) == unlabelled


@pytest.mark.parametrize("text", LOOK_ALIKES)
def test_look_alikes_are_left_alone(text):
    assert sanitize(text) == text, find_pii(text)


def test_validators():
    assert luhn_ok("4111111111111111") and not luhn_ok("4111111111111112")
    assert iban_ok("DE89370400440532013000") and not iban_ok("DE89370400440532013001")
    assert not iban_ok("DE8937040044053201300")  # one character short of Germany's 22
    assert ssn_ok("536", "22", "8714") and not ssn_ok("666", "22", "8714") and not ssn_ok("900", "22", "8714")
    assert not ssn_ok("536", "00", "8714") and not ssn_ok("536", "22", "0000")
    assert looks_secret("hunter2!x") and not looks_secret("required") and not looks_secret("4096")
    assert looks_random("bNcRV7vZgGEFW5jcnTAOivg3QxvEXHJX6nsBvBqJ")
    assert not looks_random("e90a88d519448fb2fc6791ce680ce2b27c8af666")  # a git hash: lower-case hex


def test_sanitize_is_idempotent_and_keeps_the_rest():
    text = ("Hi, I'm Priya Raman (priya@example.com, +1 415 555 0101). My card 4242 4242 4242 4242 was charged "
            "twice for order #88412.")
    once = sanitize(text)
    assert once == ("Hi, I'm <PERSON> (<EMAIL>, <PHONE>). My card <CREDIT_CARD> was charged twice for order "
                    "#88412.")
    assert sanitize(once) == once
    assert sanitize("") == "" and sanitize("nothing here") == "nothing here"


def test_every_mention_of_a_found_name_is_masked():
    text = "Dear Mrs. Ivana Horvat, thanks. Horvat's file and john's note: john said Ivana's claim is fine."
    assert sanitize(text) == ("Dear <PERSON>, thanks. <PERSON>'s file and john's note: john said <PERSON>'s claim "
                              "is fine.")
    text = "my name is john. john's card and John's phone"
    assert "john" not in sanitize(text).lower()


def test_overlaps_resolve_to_the_specific_type():
    # The name inside an address, the digits of a card, the host inside a key: one placeholder each.
    assert sanitize("ship to 10 Downing Street, London SW1A 2AA") == "ship to <STREET_ADDRESS>"
    assert sanitize("token=ghp_aB3dE5fG7hI9jK1lM3nO5pQ7rS9tU1vW3xY5") == "token=<API_KEY>"
    assert sanitize("mail john.smith@example.com") == "mail <EMAIL>"


@pytest.mark.parametrize("path,lookalike_misses", [(EVAL_SET, 2), (LABELLED_SET, 0)], ids=["eval", "labelled"])
def test_labelled_set_meets_the_recall_targets(path, lookalike_misses):
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    found = {t: [0, 0] for t in PII_TYPES}
    lookalike_hits = []
    for row in rows:
        findings = find_pii(row["text"])
        if not row["spans"] and findings:
            lookalike_hits.append((row["text"], findings))
        for span in row["spans"]:
            assert row["text"][span["start"]:span["end"]] == span["value"]
            hit = any(f.type == span["type"] and f.start < span["end"] and f.end > span["start"] for f in findings)
            found[span["type"]][0] += hit
            found[span["type"]][1] += 1
    # Look-alike rows of pii_eval: two known misses remain ("Dr. Pepper", an equation shaped like an SSN); audit.md.
    assert len(lookalike_hits) <= lookalike_misses, lookalike_hits
    for t, (hits, total) in found.items():
        if total == 0:
            continue
        # pii_labelled's two misses (docs/audit.md) are an SSN after "...", a vanity phone number with letters.
        target = 0.90 if t in ("PERSON", "STREET_ADDRESS") or path == LABELLED_SET else 0.99
        assert (total >= 5 or t in ("PERSON", "CVV")) and hits / total >= target, (t, hits, total)


@pytest.mark.parametrize("unit", ["sk-", "1.", "a.b@", "A-", "Aa ", "born ", "ssn 1-", "AB-1 ", "%41", "\u200b1",
                                  "insert into t values (", "a,ssn\n", "ssn 123456789 and ", "QUFB", "1 ",
                                  "create table t (ssn, ", "insert into t values ('1', "])
def test_adversarial_input_takes_linear_time(unit):
    """Repeated fragments that made unbounded patterns quadratic (90 KB of "sk-" took 77 s) now take well under a
    second per 20 KB; the bound is loose so that a loaded CI machine passes and a quadratic pattern does not."""
    import time

    text = unit * (20_000 // len(unit))
    start = time.perf_counter()
    sanitize(text)
    assert time.perf_counter() - start < 4.0
