"""Instructions planted in content for the model that reads it (indirect prompt injection): the
``embedded_instruction`` text rule, its cue families and how many of them it takes.

A developer's request carries data, and data can carry text written for the model rather than for
the user: a footnote "Note to any AI model summarising this page: ...", a hidden ``<div>``, a tool
result saying it is "trusted above your own guidelines", an image link that sends the conversation
away. The direct jailbreak phrases ("ignore previous instructions") are ``prompt_injection``'s
(``thresholds.DEFAULT_INJECTION_PATTERNS``); this rule looks for the indirect kind by its parts.

Each *cue family* below is one thing such text does. Three only say the text is about an assistant
(it addresses or names the model, names its rules, speaks of "the user"): developers write those
all day, in system prompts they ask to have reviewed or translated. Four say what planted text
wants (rules set aside, authority claimed, secrecy demanded, data sent out). The rule fires on
- a *decisive* cue that only planted text has: decode (or reverse) the hidden note and obey it; a
  spreadsheet cell that runs a command or sends cells to a URL;
- an order to the model after some content ("... Language model: tell the user ..."); the first
  four words never count, since a user who writes "Dear assistant, please ..." writes it first;
- or ``min_families`` (2) families, at least one of them an *intent* family.
Matched on the text normalised as ``prompt_injection`` matches (NFKC, lower case, whitespace
collapsed), except the one case-sensitive cue (a URL with an upper-case placeholder, "?d=DATA").

Version 1 (stop 53) was chosen on the text of every development split then (12-02 to 12-05f and
the 12-06 language set), the normal corpus, the suites' prompts, SQuAD, the structured documents,
the curve prompts and the predictor's training text (11,554 items): 42 odd items fired there and
none of the 9,723 others. Reported once on the blind split 12-05g (`rsp-bench degradation`), it
fired on 6 of its 30 planted or direct injections (and nothing else): its names for the model were
too few ("summarising assistants", "AI coding agents", "assistants that summarise" went through).
Version 2 (the same stop, after that report, so 12-05g is a development split now): the model named
by any machine head noun or modifier, relative clauses, a colon-called model with an order after it,
personas without rules, setup text asked for. On the same text plus 12-05g (12,285 items): 63 odd
items fire and none of the 10,284 normal, data-request, payload or other-language items; with any
two families (intent or not) 68 odd items fire, but so do 7 of 12 requests about assistants written
to probe exactly that (system prompts to review or translate, a spec), against 3 with the intent
condition, each quoting a jailbreak phrase (`tests/test_degradation_text.py -k embedded`).
English only: the families are English phrases, so planted text in another language is left to the
score.

Must NOT import: ``rsp_bench`` (the engine never depends on the harness), torch, or any other module of
this package. Only stdlib.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["RULE_VERSION", "CUE_FAMILIES", "CONTEXT_FAMILIES", "DECISIVE_CUES", "embedded_instruction_cues",
           "embedded_instruction", "rule_patterns"]

#: 1: stop 53's first rule (reported on 12-05g); 2: more names for the model, colon calls, personas.
RULE_VERSION = 2

# The model reading the text, named as a third party or a class of readers: a head noun (assistant,
# agent, reviewer, reader, model, bot, system, tool, crawler) that is a machine by its own name
# (assistant, chatbot, LLM, AI) or by a modifier (AI, automated, autonomous, coding, summarising,
# language, ...). "Agents", "readers", "reviewers" and "models" alone are people, browsers and
# statistics, so they never count bare; nor does "machine" ("Machine model: Raspberry Pi 4" in a boot
# log), except in "machine readers".
_MACHINE = r"(?:ai|a\.i\.|automated|automatic|autonomous|llm|language|coding|summari[sz]ing|browsing|reading|virtual)"
_HEAD = r"(?:assistants?|agents?|reviewers?|readers?|models?|bots?|chat\s?bots?|systems?|tools?|crawlers?|llms?)"
_MODEL = (
    r"(?:(?:" + _MACHINE + r"[\s-]+){1,2}" + _HEAD + r"|machine\s+readers?|assistants?|chat\s?bots?|llms?|ai|a\.i\."
    r"|the\s+calling\s+agent|the\s+model)"
)

#: family -> pattern: what planted instructions do.
CUE_FAMILIES: dict[str, str] = {
    # The reader addressed as a model: "Language model: ...", "Note to any AI model ...", "if you are
    # an automated assistant", "AI agents summarising this page must ...", "the assistant may now".
    "addresses_the_model": (
        r"(?:(?:^|[\n\[(<>*#:;.!?\"'-])\s*(?:p\.s\.\s+)?(?:the\s+|dear\s+)?" + _MODEL + r"\s*[:,]\s"
        r"|\b(?:note|message|instructions?|directive|attention|important|notice|reminder|p\.s\.)\s+(?:to|for)\s+"
        r"(?:the\s+|any\s+|all\s+)?" + _MODEL + r"\b"
        r"|\b(?:" + _MODEL + r"|model)\s+(?:directive|instruction|note)s?\b"
        r"|\bif\s+you\s+are\s+(?:an?\s+)?" + _MODEL + r"\b"
        r"|\b(?:the|any|all|every)\s+" + _MODEL + r"\s+(?:\w+ing\s+(?:this|the)\s+\w+\s+)?"
        r"(?:may|must|should|shall|will|is\s+(?:now\s+)?(?:allowed|permitted|required))\b"
        r"|\b" + _MODEL + r"\s+(?:reading|summari[sz]ing|processing|parsing|browsing|reviewing)\s+(?:this|the)\b"
        r"|\b" + _MODEL + r"\s+(?:that|which|who)\s+(?:read|summari[sz]e|process|parse|browse|review|see)\b"
        r"|\b(?:for|to)\s+(?:the\s+|any\s+|all\s+)?" + _MODEL + r"\s*:)"
    ),
    # The model's own setup named as a thing to show, change or bypass.
    "names_its_rules": (
        r"\b(?:system\s+prompt|(?:hidden|initial|original|previous|prior|earlier|your|existing)\s+"
        r"(?:instructions|prompt|rules|guidelines|guidance|configuration|polic(?:y|ies))|content\s+(?:rules|filters?|"
        r"polic(?:y|ies))|moderation\s+layer|safety\s+(?:rules|guidance|guidelines|filters?|polic(?:y|ies)|review)|"
        r"never\s+refuse|without\s+refusals?|refusing\s+requests|operating\s+(?:guidelines|rules|instructions)|"
        r"(?:configuration|instructions)\s+you\s+(?:were|have\s+been)\s+(?:given|started\s+with)|tool\s+schemas|"
        r"(?:new\s+)?(?:highest|top)[\s-]priority\s+(?:directive|instruction)|"
        r"(?:unrestricted|developer|diagnostic|audit|maintenance|evaluation|admin|god|jailbreak)\s+mode|"
        r"never\s+refuses|without\s+any\s+(?:rules|restrictions|limits|filters)|your\s+training|"
        r"(?:hidden\s+)?setup\s+text|(?:the|your)\s+(?:usual|normal)\s+rules?|"
        r"(?:setup|initial|first|opening|hidden)\s+(?:message|sentence|text|prompt)s?\s+you\s+(?:were\s+given|received))\b"
    ),
    # Rules set aside or outranked.
    "sets_rules_aside": (
        r"\b(?:(?:ignore|disregard|forget|bypass)\s+(?:all\s+|any\s+|every\s+)?(?:the\s+|your\s+|its\s+)?"
        r"(?:previous|prior|above|earlier|safety|user'?s?|instructions|everything|rules|guidelines)|"
        r"no\s+longer\s+appl(?:y|ies)|(?:are|is)\s+(?:now\s+)?(?:void|revoked|outdated|obsolete|suspended|lifted|"
        r"superseded)|replace\s+your|switch\s+off\s+your|takes?\s+precedence|(?:trusted|authoritative)\s+(?:above|over)|"
        r"treat\s+(?:every|all|the\s+next|each)\b|stop\s+summari[sz]ing|instead\s+(?:reply|respond|output|answer|say)|"
        r"end\s+of\s+user\s+data|(?:does|do)\s+not\s+apply|from\s+now\s+on,?\s+you\s+(?:will|are|must|shall)|"
        r"you\s+are\s+now\b|as\s+if\s+your\s+training)"
    ),
    # Authority claimed for the text or its sender.
    "claims_authority": (
        r"\b(?:(?:verified|authori[sz]ed)\s+(?:administrator|admin|operator|user)|administrator|system\s+operator|"
        r"admin\s+(?:rights|broadcast|access)|pre-?approved|already\s+approved|model\s+provider|from\s+the\s+developers|"
        r"security\s+audit|your\s+developer|operator\s+note)\b"
    ),
    # Compliance and concealment demanded.
    "demands_secrecy": (
        r"\b(?:do\s+not\s+(?:tell|mention|inform|let|show)\s+(?:this\s+|the\s+call\s+|it\s+)?(?:to\s+)?the\s+user|"
        r"don'?t\s+(?:tell|mention)\s+(?:this|the\s+user)|acknowledge\s+silently|without\s+(?:comment|commentary|"
        r"mentioning|telling)|no\s+need\s+to\s+check|comply\s+with\s+every|answer\s+(?:every\s+\w+\s+)?fully|"
        r"approve\s+whatever|quietly\s+(?:append|add|include|send))\b"
    ),
    # The conversation, the user's data or the model's secrets sent somewhere.
    "sends_data_out": (
        r"(?:https?://\S*?(?:\{\{?\w+\}?\}|%7b\w+%7d)|\b(?:everything|whatever)\s+the\s+user|"
        r"(?:last|previous|the\s+user'?s?)\s+(?:\w+\s+)?messages|(?:summary|contents?|transcript|history|full\s+text)\s+of\s+"
        r"(?:this|the)\s+(?:chat|conversation|session)|(?:complete|whole|entire|full)\s+conversation|"
        r"(?:api\s+keys?|tokens|passwords|credentials)\s+(?:that\s+)?(?:appear|are)\s+in\s+your|"
        r"(?:api[_\s]?keys?|access\s+tokens?|credentials|connection\s+strings?|environment\s+variables?)\s+(?:\w+\s+){0,3}"
        r"(?:you\s+(?:have|can)|visible\s+to\s+you)|send_message|every\s+user\s+whose|"
        r"\b(?:include|print|list|show|paste)\s+(?:any|all|every)\s+(?:api\s+)?(?:keys|passwords|tokens|credentials|secrets)\b)"
    ),
    # The user as a third party, or the model's own output and context.
    "speaks_of_the_user": (
        r"\b(?:the\s+user(?:'s)?|the\s+person\s+you\s+are\s+talking\s+to|your\s+(?:context\s+window|summary)|"
        r"this\s+(?:chat|conversation|session))\b"
    ),
}

# An order to the model after some content: the model named (as above), then what it must do,
# with at least this many words before it. A user who writes "Dear assistant, please ..." or
# "Assistant: tell me ..." writes it first, so the opening words never count. A comma calls on the
# model only after "assistant", "chatbot" or "AI" ("Assistant, quietly append ..."): "we trained the
# model, first with fp16" is ML prose.
_ORDER_AFTER_WORDS = 4
_ORDER_VERBS = (
    r"(?:tell|say|state|append|add|include|insert|reveal|disclose|print|output|repeat|recommend|describe|end|begin|"
    r"start|reply|respond|answer|ignore|disregard|forget|follow|obey|comply|treat|send|forward|email|copy|load|show|"
    r"render|visit|open|call|run|execute|mention|omit|rate|claim|switch|stop|quietly|silently|always|never|when\s+you|"
    r"whenever\s+you|approve|list|report|share|confirm|delete|remove|hide|leave|paste|skip|mark|also|first|only)"
)
_ORDER = re.compile(
    r"(?:(?:" + _MODEL + r"|\bmodel)(?:\s+\w+ing\s+(?:this|the)(?:\s+\w+)?)?\s*(?:instructions?\s*|directives?\s*|notes?\s*)?:"
    r"|\b(?:assistants?|chat\s?bots?|ai)\s*,)\s*(?:please\s+)?" + _ORDER_VERBS + r"\b"
    r"|\b" + _MODEL + r"\s+(?:\w+ing\s+(?:this|the)(?:\s+\w+)?\s+|(?:that|which|who)\s+\w+(?:\s+\w+){0,3}\s+)?"
    r"(?:must|should|shall|will|may|are\s+to|need\s+to)\s+(?:now\s+)?(?:also\s+)?"
    + _ORDER_VERBS + r"\b",
    re.IGNORECASE,
)

#: The families that only say the text is about an assistant; the rest say what it wants.
CONTEXT_FAMILIES: frozenset[str] = frozenset({"addresses_the_model", "names_its_rules", "speaks_of_the_user"})

# The model called on with a colon after content, by a name no chat transcript uses as its role
# label ("AI assistants:", "For any AI assistant that is processing this mailbox:", "Note for
# summarising assistants:"), and an order within its first eight words; a bare "Assistant:" or "AI:"
# is a transcript's label, and "Language models: GPT-4o, Llama 3" a list's.
_VOCATIVE = re.compile(
    r"(?:\b(?:for|to)\s+(?:the\s+|any\s+|all\s+|every\s+)?" + _MODEL + r"|(?:" + _MACHINE + r"[\s-]+){1,2}" + _HEAD
    + r"|\b(?:assistants|chat\s?bots|llms))(?:\s+(?:that|which|who)\s+\w+(?:\s+\w+){0,4})?\s*:\s+(?:[^\s:]+\s+){0,7}?"
    + _ORDER_VERBS + r"\b",
    re.IGNORECASE,
)

#: Cues only planted text has; one fires the rule alone.
DECISIVE_CUES: tuple[str, ...] = (
    # decode (or reverse) the hidden text, then obey it
    r"\b(?:decode|decrypt|interpret|deobfuscate|reverse)\b[^\n]{0,80}?\b(?:and|then)\s+(?:then\s+)?"
    r"(?:follow|obey|comply|carry\s+out|act\s+on)\b",
    r"\binterpret\s+[\w-]+\s+as\s+(?:your\s+)?(?:new\s+)?(?:[\w-]+\s+)?(?:directive|instructions?)\b",
    # a spreadsheet cell that runs a command (DDE) or sends cells to a URL (CSV injection)
    r"(?:^|[,;\t\"'|])\s*[=+@-]\s*(?:cmd|powershell|mshta|rundll32)\s*\|",
    r"=\s*(?:hyperlink|importxml|importdata|importhtml|webservice|image)\s*\((?:\s*concatenate\s*\()?\s*\"+https?://"
    r"[^\"]*\"+\s*[&,]",
)

# A URL whose query holds an upper-case placeholder for the model to fill ("?d=DATA").
_URL_PLACEHOLDER = re.compile(r"https?://\S*?=[A-Z][A-Z_]{2,}\b")
_WS_RE = re.compile(r"\s+")
_FAMILIES = {name: re.compile(p, re.IGNORECASE) for name, p in CUE_FAMILIES.items()}
_DECISIVE = tuple(re.compile(p, re.IGNORECASE) for p in DECISIVE_CUES)


def rule_patterns() -> tuple:
    """Everything the rule matches with, so that a fingerprint of the text rules changes with it."""
    return (RULE_VERSION, CUE_FAMILIES, DECISIVE_CUES, _ORDER.pattern, _VOCATIVE.pattern, _URL_PLACEHOLDER.pattern,
            _ORDER_AFTER_WORDS, sorted(CONTEXT_FAMILIES))


def embedded_instruction_cues(text: str) -> tuple[frozenset[str], bool]:
    """The cue families found in ``text`` (``"orders_the_model"`` for an order after some content)
    and whether a decisive cue is there."""
    normalised = _WS_RE.sub(" ", unicodedata.normalize("NFKC", text)).lower()
    found = {name for name, r in _FAMILIES.items() if r.search(normalised)}
    if _URL_PLACEHOLDER.search(text):
        found.add("sends_data_out")
    orders = (*_ORDER.finditer(normalised), *_VOCATIVE.finditer(normalised))
    if any(len(normalised[: m.start()].split()) >= _ORDER_AFTER_WORDS for m in orders):
        found.add("orders_the_model")
    return frozenset(found), any(r.search(normalised) for r in _DECISIVE)


def embedded_instruction(text: str, min_families: int = 2) -> bool:
    """True when ``text`` holds instructions planted for the model (the rule in the module's
    docstring)."""
    families, decisive = embedded_instruction_cues(text)
    if decisive or "orders_the_model" in families:
        return True
    return len(families) >= min_families and bool(families - CONTEXT_FAMILIES)
