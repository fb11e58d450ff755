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
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from agent.domain.context import Side, WorkspaceContext


class Decision(StrEnum):
    APPROVED = "approved"
    CHANGES_REQUESTED = "changes_requested"
    NONE = "none"
    """Not a decision: the reply neither approves nor asks for changes."""


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

    def describe(self) -> str:
        return (
            f"{self.decision.value} by {self.approver} for draft {self.draft_id} "
            f"(reply {self.evidence_message_id} to request {self.request_message_id}): "
            f"{self.reason}"
        )


_BIDI = re.compile("[\u200e\u200f\u202a-\u202e\u2066-\u2069\u061c]")

# -- quoted history, greetings and sign-offs -------------------------------------------------

_QUOTE_HEADERS = (
    re.compile(r"^\s*on\b.{0,200}\bwrote:\s*$", re.IGNORECASE),
    re.compile(r"^\s*-{2,}\s*original message\s*-{2,}", re.IGNORECASE),
    re.compile(r"^\s*-{2,}\s*forwarded message\s*-{2,}", re.IGNORECASE),
    re.compile(r"^\s*_{8,}\s*$"),
    re.compile(r"^\s*(?:from|sent|to|subject|date):\s", re.IGNORECASE),
    re.compile(r"^\s*(?:מאת|נשלח|אל|נושא|תאריך):\s"),
    re.compile(r"^\s*בתאריך\b.*"),
    re.compile(r".*(?:כתב|כתבה|כתב/ה)\s*:\s*$"),
)
_SIGNATURE_MARK = re.compile(
    r"^\s*(?:--|sent from my \w+.*|get outlook for \w+.*|נשלח מה-?\s*\S+.*|נשלח מ-?\s*\S+ שלי)\s*$",
    re.IGNORECASE,
)
_SIGN_OFF = re.compile(
    r"^\s*(?:thanks|thank you|many thanks|cheers|regards|best|best regards|kind regards|br|"
    r"תודה|תודה רבה|בברכה|תודה מראש|בתודה|שלך|שלכם)\s*[,.!]?\s*$",
    re.IGNORECASE,
)
_GREETINGS = r"(?:hi|hello|hey|dear|good morning|morning|היי|הי|שלום|בוקר טוב|אהלן)"
_GREETING = re.compile(r"^\s*" + _GREETINGS + r"(?:\s+[^\s.!?,:]+){0,2}\s*[,:!]?\s*$", re.I)
_INLINE_GREETING = re.compile(r"^\s*" + _GREETINGS + r"(?:\s+[^\s.!?,:-]+)?\s*[,:!\-–—]\s*", re.I)
_NAME_LINE = re.compile(r"^[^\W\d_]{2,20}(?: [^\W\d_]{1,20})?$")


def new_text(body: str) -> str:
    """The reply's own words: quoted history (``>`` lines and everything after a quote
    header), the signature block, a leading greeting and a trailing sign-off removed."""
    lines: list[str] = []
    for line in _BIDI.sub("", body).replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if _SIGNATURE_MARK.match(line) or any(p.match(line) for p in _QUOTE_HEADERS):
            break
        if line.lstrip().startswith(">"):
            continue
        lines.append(line)
    kept = [ln.strip() for ln in lines if ln.strip()]
    if kept and _GREETING.match(kept[0]):
        kept = kept[1:]
    elif kept:
        kept[0] = _INLINE_GREETING.sub("", kept[0], count=1)
    # A sign-off line ends the message; what follows it (a name, a title) is the signature.
    for index, line in enumerate(kept):
        if _SIGN_OFF.match(line) and len(kept) - index <= 4:
            kept = kept[:index]
            break
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
    r"(?:thanks|thank you) for [^,.!]{1,40}|"
    r"כן|סבבה|אוקיי|אוקי|ok|בסדר|יופי|מעולה|נהדר|מצוין|תודה|תודה רבה|יאללה|יאלה|קדימה|נראה טוב|"
    r"אחלה|הכל טוב|הכול טוב|היי|שלום|(?:תודה|תודה רבה) על [^,.!]{1,40}"
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
    r"jk|kidding|sarcasm|fired)\b"
    r"|/s\b"
    r"|(?:^|[\s.,!;:])(?:ו|ש|כש)?(?:לא|אל|אין|עדיין|רגע|חכה|חכי|חכו|אם|ברגע|אחרי|בתנאי|אבל|רק|אולי|כנראה|"
    r"אמר|אמרה|אמרו|אתמול|הקודם|הקודמת|אחר|אחרת|כבר|בטח|כאילו|חחח|במקום)(?=[\s.,!;:?]|$)"
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


def read_wording(body: str) -> Wording:
    """What an approver's reply says about the draft, read from its own new text only."""
    own = new_text(body)
    text = _normalize(own)
    if not any(ch.isalpha() for ch in text):
        return Wording(
            decision=Decision.NONE,
            reason="no words: emoji, punctuation or silence never approve",
            new_text=own,
        )
    if any(_CHANGES.search(line) for line in text.split("\n")):
        return Wording(
            decision=Decision.CHANGES_REQUESTED,
            reason="explicit change request or refusal",
            new_text=own,
        )
    if match := _DISQUALIFY.search(text):
        return Wording(
            decision=Decision.NONE,
            reason=f"not an unconditional approval ({match.group(0).strip()!r})",
            new_text=own,
        )
    odd = [ch for ch in text if _emoji(ch) and ch not in _POSITIVE_EMOJI]
    if odd:
        return Wording(
            decision=Decision.NONE, reason=f"ambiguous emoji {''.join(odd)}", new_text=own
        )
    stripped = "".join(ch for ch in text if not _emoji(ch))
    lines = stripped.split("\n")
    if len(lines) > 1 and _NAME_LINE.match(lines[-1].strip()):
        stripped = "\n".join(lines[:-1])  # a closing name is a signature
    fragments = [f.strip() for f in re.split(r"[.,!;:\n()\-–—]+", stripped) if f.strip()]
    approving = [f for f in fragments if _APPROVE.match(f)]
    other = [f for f in fragments if not _APPROVE.match(f) and not _FILLER_RE.match(f)]
    if other:
        return Wording(
            decision=Decision.NONE,
            reason=f"says more than an approval ({other[0]!r})",
            new_text=own,
        )
    if not approving:
        return Wording(
            decision=Decision.NONE,
            reason="vague positivity is not an explicit approval",
            new_text=own,
        )
    return Wording(
        decision=Decision.APPROVED, reason=f"explicit approval {approving[0]!r}", new_text=own
    )


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
    requests: tuple[ApprovalRequest, ...], in_reply_to: str | None, references: tuple[str, ...]
) -> ApprovalRequest | None:
    """The approval request a reply answers, by exact Message-ID linkage only."""
    by_id = {r.internet_message_id: r for r in requests}
    if in_reply_to is not None and in_reply_to in by_id:
        return by_id[in_reply_to]
    for ref in reversed(references):
        if ref in by_id:
            return by_id[ref]
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
        )

    if not approver_roles(context, sender):
        return decided(
            Decision.NONE,
            f"{sender} holds no recorded approval role ({', '.join(context.approval.roles)})",
        )
    if received_at < request.sent_at:
        return decided(Decision.NONE, "the reply predates the approval request")
    wording = read_wording(body)
    return decided(wording.decision, wording.reason)


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


def current_approval(
    requests: tuple[ApprovalRequest, ...],
    decisions: tuple[ApprovalDecision, ...],
    draft_digest: str,
) -> ApprovalDecision | None:
    """The approval in force for this exact draft: the draft must be the one the task's
    latest approval request carried, and the latest decision answering that request must
    approve it. An answer to an older request (a superseded draft) is on record only."""
    if not requests or requests[-1].draft_digest != draft_digest:
        return None
    latest_request = requests[-1].internet_message_id
    latest: ApprovalDecision | None = None
    for decision in decisions:
        if (
            decision.request_message_id == latest_request
            and decision.draft_digest == draft_digest
            and decision.decision is not Decision.NONE
        ):
            latest = decision
    return latest if latest is not None and latest.decision is Decision.APPROVED else None
