"""Person names and street addresses: context words, titles, sign-offs and shipped name lists.

No model: a name is a run of capitalised words that (a) follows a context phrase ("my name is", "Dear",
"signed", "Regards,\\n"), (b) follows a title ("Dr.", "Mrs"), or (c) starts with a known given name or ends with
a known surname (:mod:`meshlm.serve.name_lists`). An address is a house number, street words and a street type
("221B Baker Street", "1600 Pennsylvania Avenue NW, Washington, DC 20500"), a continental street
("Hauptstraße 12", "Via Roma 10", "10 rue de Rivoli"), or a PO box.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Iterator

from meshlm.serve.name_lists import AMBIGUOUS_GIVEN, GIVEN_NAMES, SURNAMES

Span = tuple[int, int, str]

_WORD = re.compile(r"[^\W\d_][\w'’-]*")
_PARTICLES = frozenset("van von de da del della der den di du dos das la le ter ten bin binti ibn al el y".split())
# The context patterns below start with (?=[A-Za-z]): every alternative begins with a letter, and the cheap
# look-ahead halves the time spent trying them at the other positions.
# Capitalised words that start sentences or name things, never people, even after "I am" or "this is".
_NOT_NAMES = frozenset("""
I A An The This That These Those It Its We You He She They My Our Your His Her Their Me Us Him Them Here There
Hi Hello Hey Dear Thanks Thank Regards Best Cheers Sincerely Yours Please Yes No Not Ok Okay Sure Sorry So And But Or
If When What Why How Who Where Which Also Just Then Now Today Tomorrow Yesterday Monday Tuesday Wednesday Thursday
Friday Saturday Sunday January February March April May June July August September October November December
Mr Mrs Ms Miss Dr Prof Sir Madam Team All Everyone Customer Support Service Admin Manager User Street Avenue Road
English French German Spanish Chinese Japanese American British Canadian Indian Python Java Linux Windows Google
Microsoft Apple Amazon Github Slack OpenAI Llama Order Invoice Account Ticket Version Release Model Server Error
Going Trying Working Looking Writing Calling Glad Happy Interested New Here Back Done Fine Good Great Available
Bank Company Inc Ltd LLC GmbH University College School Hospital Department Office City State County Republic
Accounts Payable Receivable Sales Billing Marketing Finance Legal Operations Engineering Reception Desk Helpdesk
To Of In On At For From By With As Is Do Does Did List
""".split())
_STRONG_CONTEXT = re.compile(
    r"(?=[A-Za-z])(?:\b(?:my|his|her|their|your|the\s+(?:patient|customer|client|employee|user|applicant)'?s?)"
    r"\s+(?:full\s+)?"
    r"name\s+(?:is|was)|\b(?:(?:first|last|full|given|family|sur|middle|maiden|customer|patient|user|contact|"
    r"display|holder|owner|employee|client|sender|recipient)[_ -]?)?name[\"']?\s*[:=]\s*[\"']?|"
    r"\bnamed|\bcalled|\bsigned|\bDear|\bAttn\.?:?|\bc/o|\bcc:|\bFrom:|\bTo:|"
    r"\bpatient:?|\bemployee:?|\bapplicant:?|\bsincerely,?|\bregards,?|\bcheers,?|\bthanks,?|\bbest,?|"
    r"\bwishes,?|\bfaithfully,?|\btruly,?|\bbeneficiary:?|\bcardholder:?|\baccount\s+holder:?|\bundersigned,?|"
    r"\bje\s+m'appelle|\bmon\s+nom\s+est|\bme\s+llamo|\bmi\s+nombre\s+es|\bmi\s+chiamo|\bmein\s+Name\s+ist|"
    r"\bich\s+hei(?:ß|ss)e|\bmeu\s+nome\s+é|\bjag\s+heter|\bmijn\s+naam\s+is)\s*", re.I)
_WEAK_CONTEXT = re.compile(
    r"(?=[A-Za-z])(?:\bthis\s+is|\bit's|\bspeak\s+(?:to|with)|\btalk\s+to|\bask\s+for|\bcontact|\bwith|\bby|"
    r"\bfrom|\bmeet|"
    r"\bmet|\bhi|\bhello|\bhey|\band|\bfor|\bsaid|\btold|\bcalled\s+me|\binform|\bto|\bthank\s+you|\bthanks)"
    r"\b\s*,?\s*", re.I)
# A person's role or relation right before: "my colleague X Y", "our CEO, X Y", "I'm X Y" — any capitalised run.
_ROLE_CONTEXT = re.compile(
    r"(?=[A-Za-z])(?:\bI\s+am|\bI'm|\bim|\bsoy|\bsono|\bich\s+bin|\bje\s+suis|\bsou|\bcontact\s+person:?|\bmanager|"
    r"\bfriend|\bcolleague|\bcoworker|\bco-worker|\bboss|\bwife|\bhusband|\bson|\bdaughter|\bmother|\bfather|"
    r"\bmom|\bmum|\bdad|\bbrother|\bsister|\bcousin|\buncle|\baunt|\bgrand(?:mother|father|ma|pa)|\bnephew|"
    r"\bniece|\bpartner|\bfianc[ée]e?|\bgirlfriend|\bboyfriend|\bneighbou?r|\blandlord|\btenant|\bCEO|\bCTO|"
    r"\bCFO|\bCOO|\bfounder|\bdirector|\bpresident|\bchair(?:man|woman|person)?|\blawyer|\battorney|\bdoctor|"
    r"\bnurse|\bteacher|\btutor|\bassistant|\bintern|\bsupervisor|\bmentor|\bcoach|\brecruiter|"
    r"\bphysician|\bdentist|\btherapist|\baccountant|"
    # verbs aimed at a person, written in lower case mid-sentence: "please ask Aiyana to", "I emailed Oluwadamilare"
    r"\b(?-i:ask|asked|tell|told|remind|reminded|email|emailed|e-mail|ping|pinged|text|texted|message|messaged|"
    r"thank|thanked|invite|invited|notify|notified|introduce|introduced|cc|cc'd|let))\b\s*,?\s*", re.I)
_PLACE_PREFIX = re.compile(r"\b(?:St|Ste|Saint|San|Santa|Santo|São|Mount|Mt|Lake|Port|Fort|Cape)\.?\s+", re.I)
_SURNAME_SHAPE = re.compile(r"^(?:O'|O’|Mc|Mac|Fitz)[A-Z]\w+$")
_TITLE = re.compile(r"\b(?<![\w.])(?:Mr|Mrs|Ms|Miss|Mx|Dr|Prof|Professor|Sir|Dame|Lady|Lord|Rev|Fr|Sr|Sra|Srta|"
                    r"Herr|Frau|Mme|Mlle|M|Sheikh|Shri|Smt|Capt|Captain|Lt|Col|Gen|Sgt|Officer|Judge|Justice)\.?\s+")
# Family-name endings common across Europe, the Caucasus, Turkey and the Americas: "Capitalised + Wiśniewski".
_SURNAME_ENDING = re.compile(r"(?:ski|ska|cki|cka|wicz|vić|vic|ović|ovic|enko|chuk|escu|eanu|opoulos|idis|akis|"
                             r"shvili|adze|oglu|oğlu|yan|sson|sen|berg|stein|mann|ez|ov|ova|ev|eva|elli|etti|"
                             r"ucci|eira|inho|ová)$")


@functools.lru_cache(maxsize=1 << 16)
def fold(word: str) -> str:
    """``Lucía`` -> ``Lucia``: name lists are matched without accents."""
    return "".join(ch for ch in unicodedata.normalize("NFKD", word) if not unicodedata.combining(ch))


def _given(word: str) -> bool:
    """A listed given name, in any case, or the first part of a hyphenated one ("Mary-Jane")."""
    word = fold(word)
    return word in GIVEN_NAMES or word.capitalize() in GIVEN_NAMES or word.split("-")[0].capitalize() in GIVEN_NAMES


@functools.lru_cache(maxsize=1 << 16)
def _strip(word: str) -> str:
    """The name inside a word: "John's" -> "John", "Chris'" -> "Chris"."""
    return re.sub(r"(?:['’]s)?['’-]*$", "", word)


def _initial(words: list[re.Match], j: int) -> bool:
    """A single capital followed by a dot: the "J." of "J. Smith" or the "A." of "John A. Smith"."""
    w = words[j]
    return len(w.group()) == 1 and w.group().isupper() and w.string[w.end():w.end() + 1] == "."


def _surname(word: str) -> bool:
    return fold(word) in SURNAMES


@functools.lru_cache(maxsize=1 << 16)
def _is_cap(word: str) -> bool:
    """Capitalised like a name: "Maria", "O'Neill", "McDonald", "Jean-Luc" — not "DTensor", "DeviceMesh", "GPU"."""
    if not word[0].isupper() or (word.isupper() and len(word) > 1):
        return False
    inner = re.sub(r"^(?:O['’]|Mc|Mac|Fitz|D['’]|L['’])", "", word)
    return not any(ch.isupper() for part in re.split(r"[-'’]", inner) for ch in part[1:])


def _name_run(words: list[re.Match], i: int) -> int:
    """Index after the run of capitalised words (with particles and initials inside) that starts at ``i``."""
    j, last_cap = i, i
    while j < len(words) and j - i < 5:
        w = words[j].group()
        if j > i:
            sep = w_sep(words, j)
            if sep.strip() not in ("", ".") or "\n" in sep or len(sep) > 2:
                break
            if sep.strip() == "." and len(words[j - 1].group()) > 1:
                break  # a full stop ends the name unless it follows an initial ("J. Smith", "John A. Smith")
        if _initial(words, j):
            pass  # an initial joins the run but does not end it
        elif _is_cap(w) and w not in _NOT_NAMES:
            last_cap = j + 1
        elif not (j > i and w.lower() in _PARTICLES):
            break
        j += 1
    return last_cap


def _caps_run(words: list[re.Match], i: int) -> int:
    """Index after a run of up to three all-capital words ("JOHN SMITH") starting at ``i``."""
    j = i + 1
    while j < len(words) and j - i < 3 and words[j].group().isupper() and words[j].group().isalpha() \
            and len(words[j].group()) > 1 and w_sep(words, j) == " ":
        j += 1
    return j


def w_sep(words: list[re.Match], j: int) -> str:
    return words[j].string[words[j - 1].end():words[j].start()]


def people(text: str) -> Iterator[Span]:
    words = list(_WORD.finditer(text))
    # Where each context phrase ends (after its blanks): a name must start exactly there. One pass per pattern.
    strong = {m.end() for m in _STRONG_CONTEXT.finditer(text)}
    weak = {m.end() for m in _WEAK_CONTEXT.finditer(text)}
    role = {m.end() for m in _ROLE_CONTEXT.finditer(text)}
    place = {m.end() for m in _PLACE_PREFIX.finditer(text)}
    titles = {m.end(): m.start() for m in _TITLE.finditer(text)}
    spans: list[Span] = []
    i = 0
    while i < len(words):
        w, pos = words[i].group(), words[i].start()
        sure = pos in strong or pos in titles or pos in role
        if (_is_cap(w) and w not in _NOT_NAMES and len(w) >= 2) or (_initial(words, i) and i + 1 < len(words)):
            end, lower = _name_run(words, i), False
        elif w.isupper() and w.isalpha() and len(w) > 1 and (
                sure or _given(w) and fold(w.capitalize()) not in AMBIGUOUS_GIVEN):
            end, lower = _caps_run(words, i), False  # "JOHN SMITH" in a form or a shouted message
            known = _given(w) or _surname(w.capitalize())
            if (end - i < 2 and not (sure and known)) or not known and not sure:
                i += 1
                continue
            sure = True
        elif w.islower() and _given(w) and w.capitalize() not in AMBIGUOUS_GIVEN:
            end, lower = i + 1, True  # "my name is sarah", "im kofi": a known name typed in lower case
            if end < len(words) and w_sep(words, end) == " " and _surname(words[end].group().capitalize()):
                end += 1  # "jessica wong"
        else:
            i += 1
            continue
        run = [_strip(m.group()) for m in words[i:end]]
        if pos in place or end <= i:
            i = max(end, i + 1)  # "St. Louis", "San Jose", "Lake Victoria": places named after people
            continue
        if run and run[-1] and _accept(run, sure, pos in weak, sure, _starts_sentence(text, pos), lower):
            stop = words[end - 1].start() + len(run[-1])
            # "Dr. Ayesha Siddiqui" is masked whole: a title beside a placeholder still narrows it down.
            spans.append((_surname_before(text, titles.get(pos, pos)), stop, "PERSON"))
            i = end
        else:
            i += 1
    yield from spans
    yield from _mentions_again(text, words, spans)


_LAST_COMMA = re.compile(r"([A-Z][\w'’-]+),\s?$")


def _surname_before(text: str, start: int) -> int:
    """Extend "Smith, John" to the family name written first."""
    m = _LAST_COMMA.search(text[max(0, start - 32):start])
    if m and m.group(1) not in _NOT_NAMES and (_surname(m.group(1)) or _SURNAME_SHAPE.match(m.group(1))
                                                or _SURNAME_ENDING.search(m.group(1))):
        return start - (len(text[max(0, start - 32):start]) - m.start())
    return start


def _mentions_again(text: str, words: list[re.Match], spans: list[Span]) -> Iterator[Span]:
    """Other mentions of a name already found ("Priya Raman ... Raman's file", "alex ... alex said"): a word of a
    found full name, or a listed name, when capitalised again; a listed given name in any case."""
    found: dict[str, bool] = {}  # folded lower-case word -> may match in lower case too
    for s, e, _ in spans:
        parts = [_strip(m.group()) for m in _WORD.finditer(text, s, e)]
        parts = [p for p in parts if len(p) >= 3 and p not in _NOT_NAMES and p.lower() not in _PARTICLES
                 and fold(p.capitalize()) not in AMBIGUOUS_GIVEN]
        for p in parts:
            listed = _given(p) or _surname(p.capitalize())
            if listed or len(parts) > 1:
                found[fold(p).lower()] = _given(p)
    if not found:
        return
    for m in words:
        name = _strip(m.group())
        any_case = found.get(fold(name).lower())
        if any_case is None or not (any_case or name[:1].isupper()):
            continue
        if not any(s <= m.start() < e for s, e, _ in spans):
            yield m.start(), m.start() + len(name), "PERSON"


def _starts_sentence(text: str, pos: int) -> bool:
    prefix = text[max(0, pos - 16):pos].rstrip(" \t\"'(")
    if not prefix and pos > 16:
        return False  # only blanks in the window: treat as mid-text
    return not prefix or prefix[-1] in ".!?\n:;"


def _accept(run: list[str], strong: bool, weak: bool, role: bool, sentence_start: bool, lower: bool = False) -> bool:
    first, last = run[0], run[-1]
    if lower:
        return strong or weak or role
    if strong or role:
        return True
    ambiguous = fold(first) in AMBIGUOUS_GIVEN
    known_last = len(run) > 1 and (_surname(last) and (len(last) > 2 or _given(first))
                                   or bool(_SURNAME_SHAPE.match(last))
                                   or bool(_SURNAME_ENDING.search(last)) and len(last) > 4)
    if len(first) == 1:
        return known_last  # "J. Smith"
    if len(run) > 1 and (_given(first) or known_last):
        return not (sentence_start and ambiguous and not known_last and not weak)
    if (_given(first) and not ambiguous) or _SURNAME_SHAPE.match(first):
        return True
    if len(run) > 1 and _surname(first) and not ambiguous and not sentence_start and (
            len(first) > 2 or _given(last)):
        return True  # family name first: "Nguyen Van An", "Zhang Wei"; "Ma Rainey" only with a listed given name
    return weak and not ambiguous and _surname(first)  # "talk to Patel"; "and Adam moments" stays


# --------------------------------------------------------------------------------------------- street address
_STREET_TYPES = (r"Street|St|Avenue|Ave|Av|Road|Rd|Boulevard|Blvd|Lane|Ln|Drive|Dr|Court|Ct|Place|Pl|Terrace|"
                 r"Ter|Way|Parkway|Pkwy|Highway|Hwy|Circle|Cir|Square|Sq|Close|Crescent|Cres|Row|Trail|Trl|Alley|"
                 r"Plaza|Path|Pike|Loop|Gardens|Grove|Mews|Walk|Hill|Heights|Park|Green|Rise|Vale|Wharf|Quay|"
                 r"Embankment|Expressway|Freeway|Turnpike|Causeway|Point|Ridge|Run|Crossing|Commons|Esplanade|"
                 r"Promenade|Strand|Gate|Bend|Cove|Glen|Meadows?|Manor|Broadway|Route|Rte|Center|Centre|Market|"
                 r"Junction|Knoll|Landing|Pass|Spur|Summit|Township|Village|Villas?|Wynd|Yard")
_DIRECTION = r"(?:N|S|E|W|NE|NW|SE|SW|North|South|East|West)\.?"
_UNIT = r"(?i:,?\s*(?:Apt|Apartment|Suite|Ste|Unit|Flat|Floor|Fl|Room|Rm|Bldg|Building|#)\.?\s*#?[\w-]{1,6})"
_POSTCODE = r"(?:[A-Z]{1,2}\d[A-Z\d]?\s*\d[A-Z]{2}|[A-Z]\d[A-Z]\s?\d[A-Z]\d|\d{5}(?:-\d{4})?|\d{4})\b"
_CITY = r"[A-Z][a-z][A-Za-z.'-]{0,30}(?:\s+[A-Z][a-z][A-Za-z.'-]{0,30}){0,2}"
# Alternatives in order (the first that matches wins, and the last may match nothing):
_CITY_TAIL = (rf"(?:\s+{_CITY}\s+[A-Z]{{2}}\s+\d{{5}}(?:-\d{{4}})?\b"  # Washington DC 20016, no commas
              rf"|,?\s*\d{{4,5}}\s+[A-Z][\w-]{{1,30}}"  # , 75008 Paris
              rf"|(?:,\s*{_CITY})?(?:,?\s*[A-Z]{{2,3}}(?=[\s,]|$))?(?:,?\s*{_POSTCODE})?)")  # , Toronto, ON M5V 2T6
_STREET_NAME_WORD = r"(?:[A-Z][\w'’.-]{0,30}|\d{1,3}(?:st|nd|rd|th)|[a-z][\w'’-]{1,30})"
_HOUSE_NUMBER = r"(?:\d{1,6}[A-Za-z]?(?:[-/]\d{1,5})?|One|Two|Three|Four|Five|Six|Seven|Eight|Nine|Ten)"
_UNIT_FIRST = r"(?:(?i:Flat|Apt\.?|Apartment|Unit|Suite|Ste\.?|Room|Floor)\s*#?\w{1,5},?\s+)?"
_NUMBER_FIRST = re.compile(
    rf"\b{_UNIT_FIRST}{_HOUSE_NUMBER},?\s+(?:{_DIRECTION}\s+)?(?P<name>(?:{_STREET_NAME_WORD}\s+){{1,4}}?)"
    rf"(?P<type>(?i:{_STREET_TYPES}))\b\.?(?:\s+{_DIRECTION}(?![\w]))?{_UNIT}?{_CITY_TAIL}")
_CONTINENTAL = re.compile(
    r"(?<![\w'’-])[A-ZÄÖÜ][\w'’-]{0,40}(?i:straße|strasse|str\.|weg|gasse|platz|allee|ring|damm|ufer|laan|"
    r"straat|gracht|plein|"
    r"vej|gade|gatan|gata|veien|vegen|katu|tie|utca|ulica)\s+\d{1,5}(?:\s?[a-z](?!\w))?\b"
    r"(?:,?\s*\d{4,5}\s+[A-ZÄÖÜ][\w-]{1,30})?"  # , 10115 Berlin
    r"|\b(?:Rue|Avenue|Boulevard|Bd|Place|Chemin|Allée|Impasse|Quai|Via|Viale|Piazza|Corso|Largo|Calle|Avenida|"
    r"Av\.|Paseo|Plaza|Rua|Travessa|Carrer|Ulica|ul\.)\s+(?:(?:de|del|della|di|da|do|dos|das|la|le|les|des|du|"
    r"d'|l')\s*){0,2}(?:[A-ZÀ-Ý][\w'’.-]{0,30}\s*){1,3},?\s+\d{1,5}[a-z]?\b"
    r"(?:,?\s*\d{4,5}\s+[A-ZÀ-Ý][\w-]{1,30})?"
    r"|\b\d{1,5}(?:\s?(?:bis|ter))?,?\s+(?i:rue|avenue|boulevard|bd|place|chemin|allée|impasse|quai|cours|route)\s+"
    r"(?:(?:de\s+la|de|du|des|d'|l')\s*)?[A-ZÀ-Ý][\w'’-]{0,30}(?:\s+[A-ZÀ-Ý][\w'’-]{0,30}){0,3}"
    r"(?:,?\s*\d{4,5}\s+[A-ZÀ-Ý][\w-]{1,30})?")
_BROADWAY = re.compile(rf"\b\d{{1,6}}\s+Broadway\b{_UNIT}?{_CITY_TAIL}")  # a street type that is a name alone
_PO_BOX = re.compile(r"\b(?:P\.?\s?O\.?\s*Box|Post\s+Office\s+Box|Postfach|Bo[iî]te\s+postale|Apartado(?:\s+de\s+"
                     r"correos)?|Casilla|Caixa\s+postal)\s+\d{1,8}(?:\s\d{2}){0,2}\b", re.I)
# "address: Flat 4, Rose Court, Leeds" — a labelled field holds an address whatever its shape (not an e-mail,
# IP, MAC, memory or wallet address: those words before "address" rule it out).
_ADDRESS_FIELD = re.compile(
    r"(?<![\w-])(?<!e-mail )(?<!email )(?<!IP )(?<!ip )(?<!MAC )(?<!mac )(?<!memory )(?<!wallet )(?<!web )"
    r"(?:(?:home|street|mailing|postal|billing|shipping|delivery|residential|current|permanent)[_ -]?)?"
    r"(?i:address|anschrift|adresse|dirección|direccion|indirizzo|endereço)[\"']?\s*[:=]\s*[\"']?"
    r"(?P<value>[^\n\"';|<>{}]{6,120})")
_NOT_STREET_WORDS = frozenset("the a an to of my our your his her their this that on in at for and or down up "
                              "more less than about around across along into over per each every as is was are be "
                              "by with from it its we you they he she i me us them than then so if".split())


# Written in lower case ("15 maple drive"), only the everyday street words count: "2 servers run", "one row".
_LOWER_TYPES = frozenset("street st avenue ave road rd drive dr lane ln boulevard blvd way court ct place pl terrace "
                         "circle highway hwy parkway".split())


def _street_case_ok(street_type: str, name_words: list[str]) -> bool:
    """Addresses are written in title case, all capitals, or (chat) all lower case — not mixed like prose."""
    if street_type.isupper() and len(street_type) > 1:
        return all(w.isupper() or w[0].isdigit() for w in name_words)  # "12 MAIN ST", not "7, as TRL"
    if street_type[0].isupper():
        return all(w[0].isupper() or w[0].isdigit() for w in name_words)
    return street_type.lower() in _LOWER_TYPES and all(w.islower() or w[0].isdigit() for w in name_words)


def street_addresses(text: str) -> Iterator[Span]:
    for m in _NUMBER_FIRST.finditer(text):
        name_words = m.group("name").split()
        if any(w.lower() in _NOT_STREET_WORDS for w in name_words):
            continue  # "5 blocks down the road", "3 of our drive"
        if not _street_case_ok(m.group("type"), name_words):
            continue
        yield m.start(), m.end(), "STREET_ADDRESS"
    for m in _ADDRESS_FIELD.finditer(text):
        value = m.group("value").rstrip(" ,.")
        if re.search(r"\d", value) and re.search(r"[A-Za-z]{3}", value) and not re.match(r"0x|[0-9a-f:]+$", value):
            yield m.start("value"), m.start("value") + len(value), "STREET_ADDRESS"
    for rx in (_CONTINENTAL, _BROADWAY, _PO_BOX):
        for m in rx.finditer(text):
            yield m.start(), m.end(), "STREET_ADDRESS"
