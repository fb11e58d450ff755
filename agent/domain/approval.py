"""Approval evidence for client-facing sends (seed 000 section 7).

Approval comes only from the workspace's recorded approval role, on the same work item and
thread (a reply in the approval thread the task itself started, about the draft that thread
carried), or from a standing approval whose recorded scope covers the exact message class.

Wording is read conservatively: a reply approves only when every sentence of its new text
(quoted history, greeting and sign-off removed) is an explicit approval or a courtesy, with
no question, condition, negation, hedge or reference to anything else. Emoji, vague
positivity ("looks good?", "great", a thumbs-up), silence and quoted approvals never
approve. English and Hebrew are recognised.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from agent.domain.context import Side, WorkspaceContext
from agent.domain.untrusted import text_flags


class Decision(StrEnum):
    APPROVED = "approved"
    CHANGES_REQUESTED = "changes_requested"
    HELD = "held"
    """The approver said more than an approval (a condition, a question, a hedge, another
    topic): no approval, and any earlier approval of the same request is suspended."""
    NONE = "none"
    """Not a decision: emoji, vague positivity, silence, or a sender without authority."""


class Wording(BaseModel):
    model_config = ConfigDict(frozen=True)

    decision: Decision
    reason: str
    new_text: str


class ApprovalRequest(BaseModel):
    """An approval request the task sent: the draft it carried and where it went."""

    model_config = ConfigDict(frozen=True)

    draft_id: str
    draft_digest: str
    internet_message_id: str
    provider_thread_id: str
    approvers: tuple[str, ...]
    sent_at: datetime
    recipients: tuple[str, ...] = ()
    """The client-facing recipients the draft was shown to go to: an approval covers a send
    to these and no one else."""
    shown_flags: tuple[str, ...] = ()
    """The warnings the request showed beside the task's title (its text is built again
    from them to read a reply's quoted history)."""


class ApprovalDecision(BaseModel):
    """What the server decided an approver's reply means, with its evidence."""

    model_config = ConfigDict(frozen=True)

    decision: Decision
    draft_id: str
    draft_digest: str
    approver: str
    evidence_message_id: str
    request_message_id: str
    reason: str
    decided_at: datetime
    replied_at: datetime | None = None
    """When the approver's reply was written (its received time): decisions count in the
    order they were made, not in the order they were processed."""

    def describe(self) -> str:
        return (
            f"{self.decision.value} by {self.approver} for draft {self.draft_id} "
            f"(reply {self.evidence_message_id} to request {self.request_message_id}): "
            f"{self.reason}"
        )


_BIDI = re.compile("[\u200e\u200f\u202a-\u202e\u2066-\u2069\u061c]")

# -- quoted history, greetings and sign-offs -------------------------------------------------

# An attribution line ("On <date>, <name> wrote:") opens quoted history only when quoted
# lines (">") follow it; it names a date or an address.
_ATTRIBUTION = (
    re.compile(r"^\s*on\b.{0,200}\bwrote:\s*$", re.IGNORECASE),
    re.compile(r"^\s*בתאריך\b.*:\s*$"),
    re.compile(r".*(?:^|\s)(?:כתב|כתבה|כתב/ה)\s*:\s*$"),
)
# Top-posted history (Outlook): everything after one of these is quoted.
_ORIGINAL = re.compile(r"^\s*-{2,}\s*(?:original|forwarded) message\s*-{2,}", re.IGNORECASE)
_FROM_FIELD = re.compile(r"^\s*(?:from|מאת)\s*:\s", re.IGNORECASE)
_OTHER_FIELD = re.compile(
    r"^\s*(?:sent|date|to|cc|subject|נשלח|תאריך|אל|עותק|נושא)\s*:\s", re.IGNORECASE
)
_RULE = re.compile(r"^\s*_{8,}\s*$")
_SIGNATURE_MARK = re.compile(
    r"^\s*(?:--|sent from my(?: \w+){1,3}|get outlook for (?:ios|android)|"
    r"נשלח מה?-?\s*(?:iphone|ipad|android|galaxy|samsung|outlook)(?: \S+){0,2})\s*$",
    re.IGNORECASE,
)
_SIGN_OFF = re.compile(
    r"^\s*(?:thanks|thank you|many thanks|cheers|regards|best|best regards|kind regards|br|"
    r"תודה|תודה רבה|בברכה|תודה מראש|בתודה)\s*[,.!]?\s*$",
    re.IGNORECASE,
)
_GREETINGS = r"(?:hi|hello|hey|dear|good morning|morning|היי|הי|שלום|בוקר טוב|אהלן)"
# A greeting alone, or with a name and then a comma or colon ("Hi Dana," / "היי דני,").
_GREETING = re.compile(
    r"^\s*" + _GREETINGS + r"(?:\s*[,:!.]?|\s+(?:[A-Z][\w'-]*|[\u0590-\u05ff]+)\s*[,:])\s*$",
    re.IGNORECASE,
)
_INLINE_GREETING = re.compile(
    r"^\s*" + _GREETINGS + r"(?:\s+(?:[A-Z][\w'-]*|[\u0590-\u05ff]+))?\s*[,:\-–—]\s*", re.I
)


def _next_text(lines: list[str], index: int) -> str:
    for line in lines[index + 1 : index + 5]:
        if line.strip():
            return line
    return ""


def _top_posted_history(lines: list[str], index: int) -> bool:
    line = lines[index]
    if _ORIGINAL.match(line):
        return True
    following = [ln for ln in lines[index + 1 : index + 5] if ln.strip()]
    if _FROM_FIELD.match(line):
        return any(_OTHER_FIELD.match(ln) for ln in following)
    if _RULE.match(line):
        return bool(following) and bool(_FROM_FIELD.match(following[0]))
    return False


def _lines(body: str) -> list[str]:
    return _BIDI.sub("", body).replace("\r\n", "\n").replace("\r", "\n").split("\n")


def split_history(body: str) -> tuple[list[str], list[str]]:
    """The reply's own lines and its quoted history: the quoted lines (``>``) after an
    attribution line, and everything after a top-posted history block (its header lines -
    From, Sent, To, Subject - left out). Answers written below or between quoted lines are
    own lines; greeting, sign-off and signature too."""
    lines = _lines(body)
    own: list[str] = []
    quoted: list[str] = []
    quoting = False
    for index, line in enumerate(lines):
        if _top_posted_history(lines, index):
            rest = (
                lines[index + 1 :] if _ORIGINAL.match(line) or _RULE.match(line) else lines[index:]
            )
            quoted.extend(
                ln for ln in rest if not (_FROM_FIELD.match(ln) or _OTHER_FIELD.match(ln))
            )
            break
        if any(p.match(line) for p in _ATTRIBUTION) and _next_text(
            lines, index
        ).lstrip().startswith(">"):
            quoting = True
            continue
        if quoting and line.lstrip().startswith(">"):
            quoted.append(line.lstrip().lstrip(">").strip())
            continue
        own.append(line)
    return own, quoted


def own_lines(body: str) -> list[str]:
    """The reply's own lines, with quoted history left out (see ``split_history``)."""
    return split_history(body)[0]


def _folded(text: str) -> str:
    return " ".join(
        unicodedata.normalize("NFKC", _BIDI.sub("", text)).lower().replace(">", " ").split()
    )


_URL = re.compile(r"<?(?:https?://|mailto:|www\.)[^\s>]*>?", re.IGNORECASE)


def _words(text: str) -> str:
    """The words of ``text``, links and punctuation left out (a mail client quotes a link
    as ``text<https://...>`` and bold as ``*text*``)."""
    return " ".join(re.findall(r"\w+", _URL.sub(" ", _folded(text))))


def notes_in_history(quoted: list[str], sent: str) -> list[str]:
    """Lines of the quoted history whose words are not a run of words of what was sent:
    words the approver wrote into the quoted original (an inline note), which count like
    any other."""
    original = f" {_words(sent)} "
    return [line for line in quoted if (words := _words(line)) and f" {words} " not in original]


def _same_name(line: str, names: tuple[str, ...]) -> bool:
    folded = " ".join(line.lower().replace(",", " ").split())
    return bool(folded) and any(folded == " ".join(n.lower().split()) for n in names)


_CONTACT = re.compile(
    r"^(?:(?:tel|phone|mobile|mob|cell|fax|office|direct|m|t|p|f|e|w|email|web|טל|טלפון|נייד|"
    r"פקס|משרד|דוא\"ל)\s*[.:]\s*)?[+(]?[\d][\d\s().\-/+]{5,}$"
    r"|^\S+@\S+\.\S+$|^(?:https?://|www\.)\S+$",
    re.IGNORECASE,
)
_SEPARATOR = re.compile(r"^[\s\-_=*~.|•·]+$")


def _signature_line(line: str, names: tuple[str, ...]) -> bool:
    """A line a signature block is made of: the signer's name, contact data (a phone, an
    address, a URL) or a separator. Anything else - a title, a disclaimer, a word - is
    read as the approver's own, and holds the approval for a person."""
    text = line.strip()
    return (
        not text or bool(_SEPARATOR.match(text) or _CONTACT.match(text)) or _same_name(text, names)
    )


def below_signature(body: str, signer_names: tuple[str, ...] = ()) -> list[str]:
    """The lines under a signature marker that are not a signature: the approver's words,
    which count like any other."""
    lines = own_lines(body)
    marks = [i for i, line in enumerate(lines) if _SIGNATURE_MARK.match(line)]
    if not marks:
        return []
    return [ln for ln in lines[marks[0] + 1 :] if not _signature_line(ln, signer_names)]


def new_text(body: str, signer_names: tuple[str, ...] = ()) -> str:
    """The reply's core words: its own lines without the signature block, a leading
    greeting, and trailing sign-off lines or the signer's own name."""
    kept: list[str] = []
    for line in own_lines(body):
        if _SIGNATURE_MARK.match(line):
            break
        if line.strip():
            kept.append(line.strip())
    if kept and _GREETING.match(kept[0]):
        kept = kept[1:]
    elif kept:
        kept[0] = _INLINE_GREETING.sub("", kept[0], count=1)
    while kept and (_SIGN_OFF.match(kept[-1]) or _same_name(kept[-1], signer_names)):
        kept.pop()
    return "\n".join(kept)


# -- wording ----------------------------------------------------------------------------------

# Whole fragments that approve (after normalization). A fragment must equal one of these.
_APPROVE_EN = (
    r"(?:yes |ok |okay )?(?:i )?approve(?:d)?(?: (?:this|it|the draft|this draft))?"
    r"(?: (?:to|for) (?:send|sending))?(?: as is)?",
    r"(?:yes |ok |okay )?(?:this is |it is |it's |its )?approved(?: (?:to|for) (?:send|sending))?"
    r"(?: as is)?",
    r"(?:it's |its |it is |this is )?(?:ok|okay|good|fine|cleared) to (?:send|go)(?: out)?"
    r"(?: as is)?",
    r"(?:you )?(?:can|may) (?:send|go ahead)(?: it| this)?(?: out)?(?: now)?(?: as is)?",
    r"(?:yes |ok |okay )?(?:please )?(?:go ahead|proceed)(?: and send(?: it| this)?(?: out)?)?"
    r"(?: with (?:the send|sending))?",
    r"(?:yes |ok |okay )?(?:please )?send(?: it| this)?(?: out)?(?: now)?(?: as is)?",
    r"(?:you have|you've got|you got|consider this) my approval",
    r"approval granted",
    r"green light",
    r"(?:this is )?good to go",
)
_APPROVE_HE = (
    r"(?:ו)?(?:אני )?(?:מאשר|מאשרת|מאשרים)(?: את זה| את הטיוטה)?(?: (?:לשליחה|לשלוח))?",
    r"(?:ו)?(?:מאושר|מאושרת|אושר|אושרה)(?: מבחינתי)?(?: (?:לשליחה|לשלוח))?",
    r"(?:ו)?(?:אפשר|ניתן|מותר) לשלוח(?: את זה| את המייל| את הטיוטה)?(?: כמו שזה)?",
    r"(?:ו)?(?:יש|יש לך|יש לכם|קיבלת|קיבלתם) (?:את )?(?:האישור שלי|אישור)(?: לשליחה| לשלוח)?",
    r"(?:ו)?אישור לשליחה",
    r"(?:ו)?(?:תשלח|תשלחי|תשלחו|שלח|שלחי|שלחו|לשלוח)(?: את זה| את המייל| את הטיוטה)?"
    r"(?: כמו שזה)?",
    r"(?:ו)?(?:קדימה|יאללה|יאלה) (?:לשלוח|תשלחו|תשלח|תשלחי|שלחו|שלחי|שלח)",
    r"(?:אז )?שולחים",
)
_FILLER = (
    r"yes|yep|yeah|ok|okay|sure|sure thing|great|perfect|thanks|thx|thank you|many thanks|"
    r"all good|looks good|looks great|lgtm|nice|cheers|confirmed|hi|hey|hello|"
    r"כן|סבבה|אוקיי|אוקי|ok|בסדר|יופי|מעולה|נהדר|מצוין|תודה|תודה רבה|יאללה|יאלה|קדימה|נראה טוב|"
    r"אחלה|הכל טוב|הכול טוב|היי|שלום"
)
# What may follow an approval without changing it: a destination, a time, a courtesy.
_TAIL_EN = (
    r"(?: to the client| to them| out)?(?: today| now| asap| whenever you're ready)?(?: please)?"
)
_TAIL_HE = r"(?: ללקוח| ללקוחה| להם)?(?: עוד היום| היום| עכשיו)?(?: בבקשה)?"
_LEAD = r"(?:(?:ok|okay|yes|sure|סבבה|אוקי|אוקיי|כן|יאללה|יאלה|קדימה) )?"
_APPROVE = re.compile(
    r"^"
    + _LEAD
    + r"(?:(?:"
    + "|".join(_APPROVE_EN)
    + r")(?: as written)?"
    + _TAIL_EN
    + r"|(?:"
    + "|".join(_APPROVE_HE)
    + r")(?: את הנוסח| כמו שזה)?"
    + _TAIL_HE
    + r")$"
)
_FILLER_RE = re.compile(r"^(?:" + _FILLER + r")$")

_CHANGES = re.compile(
    r"\b(?:not approved|disapprove|reject(?:ed)?|don'?t send|do not send|please (?:change|fix|"
    r"correct|update|edit|revise|remove|add)|(?:needs?|requires?) (?:some )?(?:changes|edits|"
    r"fixing|work|a fix)|(?:change|fix|correct|update|edit|revise|remove) (?:the|this|that|it|"
    r"a|an)\b|hold off|(?:is|are) wrong)"
    r"|^(?:please |can you |could you )?(?:change|swap|replace|shorten|soften|rewrite|rephrase|"
    r"attach|cc|add|remove|fix|correct)\b"
    r"|\bresend\b|\bsend (?:it |this )?(?:back|again) (?:to me|for approval)"
    r"|(?:^|\s)(?:תוסיפו|תוסיף|תוסיפי|תחליפו|תחליף|תחליפי|תקצרו|תקצר|תקצרי|תרככו|תרככי|שנו|"
    r"תעבירי|תעבירו|לאישור חוזר|שוב לאישור)(?=\s|$)"
    r"|(?:לא מאשר|לא מאשרת|לא מאושר|לא לשלוח|אל תשלח|אל תשלחי|אל תשלחו|לתקן|תתקן|תתקני|תתקנו|"
    r"לשנות|תשנה|תשני|תשנו|צריך תיקון|צריך לתקן|יש טעות|לא נכון|להוריד|תוריד|תורידי|תורידו)"
)
_DISQUALIFY = re.compile(
    r"\?|\.\.\.|…"
    r"|\b(?:not|no|nope|never|don'?t|dont|doesn'?t|isn'?t|can'?t|cannot|won'?t|wouldn'?t|"
    r"shouldn'?t|wait|hold|unless|if|once|after|when|provided|assuming|until|but|however|"
    r"except|only|maybe|perhaps|probably|would|could|might|should|think|guess|said|says|"
    r"told|yesterday|tomorrow|later|soon|earlier|previous|other|another|last|already|instead|"
    r"yet|right|lol|lmao|"
    r"jk|kidding|sarcasm|fired|stop|pause|scratch|ignore|disregard|wrong|mistake|oops|sorry|"
    r"cancel|cancell?ed|retract|retracted|withdraw|withdrawn|mind|hmm+)\b"
    r"|[:;=]'?-?[()\[\]dpo/\\|*]|\(\s*[!?]+\s*\)|>"  # emoticons, "(!)", unquoted ">"
    r"|/s\b"
    r"|(?:^|[\s.,!;:])(?:ו|ש|כש)?(?:לא|אל|אין|עדיין|רגע|חכה|חכי|חכו|אם|ברגע|אחרי|בתנאי|אבל|רק|אולי|כנראה|"
    r"אמר|אמרה|אמרו|אתמול|הקודם|הקודמת|אחר|אחרת|כבר|בטח|כאילו|חחח|במקום|טעות|טעיתי|"
    r"תתעלמו|תתעלם|התעלמו|להתעלם|בטל|מבוטל|לבטל|סליחה|עצור|עצרי|עצרו|תעצור|תעצרו|רגע)"
    r"(?=[\s.,!;:?]|$)"
)
_POSITIVE_EMOJI = frozenset("👍✅👌🙏😊🙂✔☑🆗💯🚀")


def _normalize(text: str) -> str:
    text = unicodedata.normalize("NFKC", _BIDI.sub("", text)).lower()
    text = text.replace("’", "'").replace("‘", "'")
    text = re.sub(r"(\w)\1{2,}", r"\1", text)  # "approveddd", "מאושררר"
    # Hebrew geresh/gershayim and quotes are part of words; other punctuation separates.
    return "\n".join(" ".join(line.split()) for line in text.split("\n") if line.strip())


def _emoji(ch: str) -> bool:
    return unicodedata.category(ch) == "So" or ord(ch) >= 0x1F000


def read_wording(
    body: str,
    signer_names: tuple[str, ...] = (),
    *,
    sent: str | None = None,
    subject_words: str = "",
) -> Wording:
    """What an approver's reply says about the draft.

    Every word the approver wrote counts wherever it sits - greeting, sign-off, P.S., the
    lines under a signature marker, a note written into the quoted original, the words they
    put in the subject - and is checked for a change request, a condition, a negation, a
    hedge, a retraction or a suspicious character. Then the core text must consist of
    explicit approvals and courtesies only, and any line under a signature that is not a
    signature (the signer's name, contact data) holds the approval for a person.

    ``signer_names`` are the approver's recorded names (a closing name line is theirs).
    ``sent`` is the text of the request the reply answers, as it was sent: quoted history
    is compared with it, and a quoted line that is not in it is the approver's own. With
    ``sent`` None the quoted history is not compared (the wording of a reply alone).
    ``subject_words`` are the words the approver wrote into the reply's subject.
    """
    own, quoted = split_history(body)
    notes = notes_in_history(quoted, sent) if sent is not None else []
    subject = [subject_words] if subject_words.strip() else []
    own_text = "\n".join([*subject, *own, *notes])
    core = "\n".join([*subject, new_text(body, signer_names), *notes]).strip()
    decision, reason = _objection(own_text) or _core_reading(_normalize(core), body, signer_names)
    return Wording(decision=decision, reason=reason, new_text=core)


def _objection(own_text: str) -> tuple[Decision, str] | None:
    """Anything the approver wrote anywhere that withholds the approval: a change request or
    refusal, a condition, negation, hedge or retraction, a suspicious character, an
    ambiguous emoji. None when there is none."""
    full = _normalize(own_text)
    flat = " ".join(full.split())
    if any(_CHANGES.search(line) for line in full.split("\n")) or _CHANGES.search(flat):
        return Decision.CHANGES_REQUESTED, "explicit change request or refusal"
    if match := _DISQUALIFY.search(flat):
        return Decision.HELD, f"not an unconditional approval ({match.group(0).strip()!r})"
    if suspicious := [f for f in text_flags(own_text) if "mixed-script" in f or "invisible" in f]:
        return Decision.HELD, suspicious[0]
    odd = [ch for ch in full if _emoji(ch) and ch not in _POSITIVE_EMOJI]
    if odd:
        return Decision.HELD, f"ambiguous emoji {''.join(odd)}"
    return None


def _core_reading(text: str, body: str, signer_names: tuple[str, ...]) -> tuple[Decision, str]:
    """The core text approves only when it holds an explicit approval and nothing but
    approvals and courtesies, with nothing but a signature under the signature marker."""
    if not any(ch.isalpha() for ch in text):
        return Decision.NONE, "no words: emoji, punctuation or silence never approve"
    stripped = "".join(ch for ch in text if not _emoji(ch))
    fragments = [f.strip() for f in re.split(r"[.,!;:\n()\-–—]+", stripped) if f.strip()]
    approving = [f for f in fragments if _APPROVE.match(f)]
    other = [f for f in fragments if not _APPROVE.match(f) and not _FILLER_RE.match(f)]
    if other:
        return Decision.HELD, f"says more than an approval ({other[0]!r})"
    if unsigned := below_signature(body, signer_names):
        return (
            Decision.HELD,
            f"words under the signature marker are not a signature ({unsigned[0]!r})",
        )
    if not approving:
        return Decision.NONE, "vague positivity is not an explicit approval"
    return Decision.APPROVED, f"explicit approval {approving[0]!r}"


#: How parts that disagree combine: the most restrictive reading wins.
_STRICTNESS = (Decision.CHANGES_REQUESTED, Decision.HELD, Decision.NONE, Decision.APPROVED)


def strictest(decisions: list[Decision]) -> Decision:
    """The reading of a reply whose parts (plain text, HTML) were read separately: it
    approves only when every part approves."""
    for decision in _STRICTNESS:
        if decision in decisions:
            return decision
    return Decision.NONE


# -- evidence ---------------------------------------------------------------------------------


def approver_roles(context: WorkspaceContext, address: str) -> tuple[str, ...]:
    """The recorded approval roles an internal contact holds (empty for anyone else)."""
    wanted = address.strip().lower()
    roles: set[str] = set()
    for contact in context.contacts:
        if contact.address == wanted and contact.side is Side.INTERNAL:
            roles |= set(contact.roles) & set(context.approval.roles)
    if any(c.address == wanted and c.side is Side.CLIENT for c in context.contacts):
        return ()  # conflicting evidence never grants authority
    return tuple(sorted(roles))


def approvers(context: WorkspaceContext) -> tuple[str, ...]:
    return tuple(
        dict.fromkeys(c.address for c in context.contacts if approver_roles(context, c.address))
    )


def request_answered(
    requests: tuple[ApprovalRequest, ...], in_reply_to: str | None
) -> ApprovalRequest | None:
    """The approval request a reply answers: the one its In-Reply-To names exactly. A reply
    to someone else's message in the approval thread (References only) answers that
    message, not the request."""
    for request in requests:
        if in_reply_to is not None and request.internet_message_id == in_reply_to:
            return request
    return None


def judge_reply(
    context: WorkspaceContext,
    request: ApprovalRequest,
    *,
    sender: str,
    message_id: str,
    received_at: datetime,
    body: str,
    now: datetime,
    sent: str | None = None,
    subject_words: str = "",
) -> ApprovalDecision:
    """The decision an inbound reply to ``request`` carries. Authority comes from the live
    context's approval roles; the wording is read from the reply's own new text."""

    def decided(decision: Decision, reason: str) -> ApprovalDecision:
        return ApprovalDecision(
            decision=decision,
            draft_id=request.draft_id,
            draft_digest=request.draft_digest,
            approver=sender.strip().lower(),
            evidence_message_id=message_id,
            request_message_id=request.internet_message_id,
            reason=reason,
            decided_at=now,
            replied_at=received_at,
        )

    if not approver_roles(context, sender):
        return decided(
            Decision.NONE,
            f"{sender} holds no recorded approval role ({', '.join(context.approval.roles)})",
        )
    # Mail dates have whole seconds: a reply stamped in the request's own second is after it.
    if received_at < request.sent_at.replace(microsecond=0):
        return decided(Decision.NONE, "the reply predates the approval request")
    names = tuple(
        n
        for c in context.contacts
        if c.address == sender.strip().lower() and c.name.split()
        for n in (c.name, c.name.split()[0])
    )
    wording = read_wording(body, names, sent=sent, subject_words=subject_words)
    return decided(wording.decision, wording.reason)


# Reply and forward prefixes mail clients write (and the tags a mail gateway puts in front,
# such as "[EXT]").
_REPLY_PREFIX = re.compile(
    r"^\s*(?:(?:\[[^\]]{1,20}\]|(?:re|aw|sv|vs|antw|rif|odp|ynt|réf|fwd?|wg|tr|回复|答复|回覆|"
    r"转发|תגובה|השב|הועבר)\s*(?:\[\d+\])?\s*[:：])\s*)+",
    re.IGNORECASE,
)


_PUNCTUATION = ".,;:!?-–—|()[]\"'"


def subject_words(reply_subject: str, request_subject: str) -> str:
    """The words an approver wrote into their reply's subject: its words, reply prefixes
    left out, that the request's own subject does not have (a subject cut short or kept as
    it was adds nothing)."""
    asked = {w.strip(_PUNCTUATION) for w in _folded(request_subject).split()}
    words = _REPLY_PREFIX.sub("", _BIDI.sub("", reply_subject)).split()
    return " ".join(w for w in words if _folded(w).strip(_PUNCTUATION) not in asked)


def standing_covers(context: WorkspaceContext, message_class: str | None) -> str | None:
    """The standing approval whose recorded scope covers this exact message class."""
    if not message_class:
        return None
    for standing in context.approval.standing:
        if standing.scope == "message_class" and standing.message_class == message_class:
            return f"standing approval for message class {message_class!r} granted by " + (
                standing.granted_by
            )
    return None


def decisions_on(
    request: ApprovalRequest, decisions: tuple[ApprovalDecision, ...]
) -> list[ApprovalDecision]:
    """The decisions that answer ``request``, in the order the approvers wrote them."""
    found = [
        d
        for d in decisions
        if d.request_message_id == request.internet_message_id
        and d.draft_digest == request.draft_digest
        and d.decision is not Decision.NONE
    ]
    return sorted(found, key=lambda d: d.replied_at or d.decided_at)


def current_approval(
    requests: tuple[ApprovalRequest, ...],
    decisions: tuple[ApprovalDecision, ...],
    draft_digest: str,
) -> ApprovalDecision | None:
    """The approval in force for this exact draft, or None.

    The draft must be the one the task's latest approval request carried. Any change
    request on that request voids it (a new request is needed). Otherwise every approver
    who answered counts by their latest answer, in the order they wrote them: one approver's
    reservation is not cleared by another's approval, and at least one must approve.
    """
    if not requests or requests[-1].draft_digest != draft_digest:
        return None
    answered = decisions_on(requests[-1], decisions)
    if any(d.decision is Decision.CHANGES_REQUESTED for d in answered):
        return None
    latest: dict[str, ApprovalDecision] = {}
    for decision in answered:
        latest[decision.approver] = decision
    if not latest or any(d.decision is not Decision.APPROVED for d in latest.values()):
        return None
    return max(latest.values(), key=lambda d: d.replied_at or d.decided_at)


# -- an approver's decision given in the console ------------------------------------------------

CONSOLE_EVIDENCE = "console:"
"""The prefix of a console decision's evidence id (an emailed one is a Message-ID)."""


def judge_console(
    context: WorkspaceContext,
    request: ApprovalRequest,
    *,
    approver: str,
    decision: Decision,
    draft_digest: str,
    recipients: Sequence[str],
    note: str,
    evidence_id: str,
    now: datetime,
) -> ApprovalDecision | str:
    """A decision a signed-in person gives on the console, judged by the rules an emailed
    one meets: the person holds a recorded approval role in the live context, and decides
    on exactly the draft (its digest) and the recipients the latest request carried. The
    wording question does not arise: the button says it. Returns why not, as text."""
    person = approver.strip().lower()
    if decision not in (Decision.APPROVED, Decision.CHANGES_REQUESTED):
        return f"a person approves or requests changes; {decision.value} is neither"
    if not approver_roles(context, person):
        return (
            f"{person} holds no recorded approval role in this workspace "
            f"({', '.join(context.approval.roles)})"
        )
    if draft_digest != request.draft_digest:
        return (
            f"the draft shown is not the one approval was requested for (draft "
            f"{request.draft_id}): reload the task and decide on what it shows now"
        )
    if sorted(r.strip().lower() for r in recipients) != sorted(request.recipients):
        return (
            "the recipients shown are not the ones approval was requested for ("
            + ", ".join(request.recipients)
            + "): reload the task"
        )
    if decision is Decision.CHANGES_REQUESTED and not note.strip():
        return "say what should change: a change request carries a note"
    reason = "approved in the console" if decision is Decision.APPROVED else note.strip()
    return ApprovalDecision(
        decision=decision,
        draft_id=request.draft_id,
        draft_digest=request.draft_digest,
        approver=person,
        evidence_message_id=CONSOLE_EVIDENCE + evidence_id,
        request_message_id=request.internet_message_id,
        reason=reason,
        decided_at=now,
        replied_at=now,
    )
