"""The providers' response shapes the adapters read, as pydantic models.

Written from the providers' published references; each model names its reference. Unknown
fields are ignored (providers add fields over time), but every field a model declares is
typed as the reference gives it, so a response that breaks the reference fails validation.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Shape(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)


# -- Gmail API v1 ---------------------------------------------------------------------------


class GmailHeader(_Shape):
    """https://developers.google.com/gmail/api/reference/rest/v1/users.messages#MessagePartHeader"""

    name: str
    value: str


class GmailPartBody(_Shape):
    """https://developers.google.com/gmail/api/reference/rest/v1/users.messages.attachments#MessagePartBody"""

    size: int = 0
    data: str | None = None
    attachment_id: str | None = Field(default=None, alias="attachmentId")


class GmailPart(_Shape):
    """https://developers.google.com/gmail/api/reference/rest/v1/users.messages#MessagePart"""

    part_id: str = Field(default="", alias="partId")
    mime_type: str = Field(default="", alias="mimeType")
    filename: str = ""
    headers: tuple[GmailHeader, ...] = ()
    body: GmailPartBody | None = None
    parts: tuple[GmailPart, ...] = ()


class GmailMessage(_Shape):
    """https://developers.google.com/gmail/api/reference/rest/v1/users.messages#Message"""

    id: str
    thread_id: str = Field(alias="threadId")
    label_ids: tuple[str, ...] = Field(default=(), alias="labelIds")
    snippet: str = ""
    history_id: str | None = Field(default=None, alias="historyId", pattern=r"^\d+$")
    internal_date: str | None = Field(default=None, alias="internalDate", pattern=r"^\d+$")
    size_estimate: int | None = Field(default=None, alias="sizeEstimate")
    payload: GmailPart | None = None
    raw: str | None = None


class GmailMessageRef(_Shape):
    """https://developers.google.com/gmail/api/reference/rest/v1/users.messages/list#response-body"""

    id: str
    thread_id: str = Field(alias="threadId")


class GmailMessageList(_Shape):
    """https://developers.google.com/gmail/api/reference/rest/v1/users.messages/list#response-body"""

    messages: tuple[GmailMessageRef, ...] = ()
    next_page_token: str | None = Field(default=None, alias="nextPageToken")
    result_size_estimate: int | None = Field(default=None, alias="resultSizeEstimate")


class GmailHistoryMessageAdded(_Shape):
    """https://developers.google.com/gmail/api/reference/rest/v1/users.history/list#MessageAdded"""

    message: GmailMessage


class GmailHistory(_Shape):
    """https://developers.google.com/gmail/api/reference/rest/v1/users.history/list#History"""

    id: str = Field(pattern=r"^\d+$")
    messages: tuple[GmailMessageRef, ...] = ()
    messages_added: tuple[GmailHistoryMessageAdded, ...] = Field(default=(), alias="messagesAdded")


class GmailHistoryList(_Shape):
    """https://developers.google.com/gmail/api/reference/rest/v1/users.history/list#response-body"""

    history: tuple[GmailHistory, ...] = ()
    next_page_token: str | None = Field(default=None, alias="nextPageToken")
    history_id: str = Field(alias="historyId", pattern=r"^\d+$")


class GmailProfile(_Shape):
    """https://developers.google.com/gmail/api/reference/rest/v1/users/getProfile#response-body"""

    email_address: str = Field(alias="emailAddress")
    messages_total: int = Field(alias="messagesTotal")
    threads_total: int = Field(alias="threadsTotal")
    history_id: str = Field(alias="historyId", pattern=r"^\d+$")


class GoogleErrorDetail(_Shape):
    """https://cloud.google.com/apis/design/errors#http_mapping (the ``errors`` entries)"""

    message: str = ""
    domain: str = ""
    reason: str = ""


class GoogleError(_Shape):
    """https://cloud.google.com/apis/design/errors#http_mapping"""

    code: int
    message: str
    status: str
    errors: tuple[GoogleErrorDetail, ...] = ()


class GoogleErrorBody(_Shape):
    """https://cloud.google.com/apis/design/errors#http_mapping"""

    error: GoogleError


# -- Microsoft Graph v1.0 --------------------------------------------------------------------


class GraphEmailAddress(_Shape):
    """https://learn.microsoft.com/graph/api/resources/emailaddress"""

    address: str | None = None
    name: str | None = None


class GraphRecipient(_Shape):
    """https://learn.microsoft.com/graph/api/resources/recipient"""

    email_address: GraphEmailAddress = Field(alias="emailAddress")


class GraphItemBody(_Shape):
    """https://learn.microsoft.com/graph/api/resources/itembody"""

    content: str | None = None
    content_type: str = Field(alias="contentType", pattern=r"^(text|html)$")


class GraphHeader(_Shape):
    """https://learn.microsoft.com/graph/api/resources/internetmessageheader"""

    name: str | None = None
    value: str | None = None


class GraphMessage(_Shape):
    """https://learn.microsoft.com/graph/api/resources/message"""

    id: str
    conversation_id: str | None = Field(default=None, alias="conversationId")
    internet_message_id: str | None = Field(default=None, alias="internetMessageId")
    subject: str | None = None
    received_date_time: str | None = Field(default=None, alias="receivedDateTime")
    sent_date_time: str | None = Field(default=None, alias="sentDateTime")
    is_draft: bool | None = Field(default=None, alias="isDraft")
    is_read: bool | None = Field(default=None, alias="isRead")
    parent_folder_id: str | None = Field(default=None, alias="parentFolderId")
    categories: tuple[str, ...] = ()
    body: GraphItemBody | None = None
    sender: GraphRecipient | None = None
    from_: GraphRecipient | None = Field(default=None, alias="from")
    to_recipients: tuple[GraphRecipient, ...] = Field(default=(), alias="toRecipients")
    cc_recipients: tuple[GraphRecipient, ...] = Field(default=(), alias="ccRecipients")
    internet_message_headers: tuple[GraphHeader, ...] = Field(
        default=(), alias="internetMessageHeaders"
    )


class GraphMessageCollection(_Shape):
    """https://learn.microsoft.com/graph/paging"""

    value: tuple[GraphMessage, ...]
    next_link: str | None = Field(default=None, alias="@odata.nextLink")


class GraphMailFolder(_Shape):
    """https://learn.microsoft.com/graph/api/resources/mailfolder"""

    id: str
    display_name: str | None = Field(default=None, alias="displayName")
    parent_folder_id: str | None = Field(default=None, alias="parentFolderId")
    total_item_count: int | None = Field(default=None, alias="totalItemCount")
    unread_item_count: int | None = Field(default=None, alias="unreadItemCount")


class GraphUser(_Shape):
    """https://learn.microsoft.com/graph/api/resources/user"""

    id: str
    mail: str | None = None
    user_principal_name: str | None = Field(default=None, alias="userPrincipalName")
    display_name: str | None = Field(default=None, alias="displayName")


class GraphErrorDetail(_Shape):
    """https://learn.microsoft.com/graph/errors#error-resource-type"""

    code: str
    message: str


class GraphErrorBody(_Shape):
    """https://learn.microsoft.com/graph/errors#error-resource-type"""

    error: GraphErrorDetail


class GraphDraft(GraphMessage):
    """https://learn.microsoft.com/graph/api/resources/message (a draft as Graph holds it
    before it is sent: every list it would be sent to)"""

    bcc_recipients: tuple[GraphRecipient, ...] = Field(default=(), alias="bccRecipients")
    reply_to: tuple[GraphRecipient, ...] = Field(default=(), alias="replyTo")
    has_attachments: bool | None = Field(default=None, alias="hasAttachments")
