/* data_sft.c: supervised fine-tuning records to token ids and a loss mask.
 *
 * Two record shapes (doc/data.md, "Supervised fine-tuning input"):
 *  - {"prompt": P, "completion": C} (keys configurable): tokenized as
 *    NeMo AutoModel's prompt/completion formatting does it: the ids of
 *    P + C with the tokenizer's special tokens, the first len(ids(P))
 *    masked out, and EOS appended (mask 1) unless the ids end with it;
 *  - {"messages": [{"role", "content"}, ...]}: rendered with the Llama 3 or
 *    the ChatML template, natively (no Jinja): headers, the system prompt
 *    and user turns are 0, each assistant turn's content and its
 *    end-of-turn token are 1.  The conversation must end with an
 *    assistant turn; EOS is appended (mask 1) unless the ids end with it.
 * Each piece of a rendered conversation is encoded on its own and the ids
 * concatenated: the pieces meet at special tokens or right after a header's
 * line break, where the pre-tokenizers of both families split anyway.
 *
 * Not here: reading records (data_par.c), Jinja templates in general (any
 * template other than the two is refused by name). */
#include <config.h>

#include "data_write_internal.h"

#include <jansson.h>
#include <string.h>

const char *mt_chat_name(mt_chat_t c)
{
    return c == MT_CHAT_LLAMA3 ? "llama3" : c == MT_CHAT_CHATML ? "chatml" : "auto";
}

mt_status_t mt_chat_resolve(const mt_tokenizer_t *tok, mt_chat_t want, mt_chat_t *out)
{
    *out = want;
    if (want != MT_CHAT_AUTO)
        return MT_OK;
    const char *t = mt_tokenizer_chat_template(tok);
    const char *src = mt_tokenizer_path(tok)[0] ? mt_tokenizer_path(tok) : "the byte tokenizer";
    if (!t)
        MT_FAIL(MT_ERR_CONFIG, "%s has no chat template to render \"messages\" with; pass "
                "--chat-template llama3 or chatml", src);
    if (strstr(t, "<|start_header_id|>") && strstr(t, "<|eot_id|>")) {
        if (strstr(t, "Cutting Knowledge Date"))
            MT_FAIL(MT_ERR_UNSUPPORTED, "%s: the chat template is the Llama 3.1-style one (a "
                    "dated system header, tools), which meshtrain does not render; it renders "
                    "llama3 (Llama 3) and chatml: pass --chat-template to choose one", src);
        *out = MT_CHAT_LLAMA3;
        return MT_OK;
    }
    if (strstr(t, "<|im_start|>") && strstr(t, "<|im_end|>")) {
        if (strstr(t, "<think>"))
            MT_FAIL(MT_ERR_UNSUPPORTED, "%s: the chat template is a ChatML one with reasoning "
                    "(<think>, as Qwen3's), which meshtrain does not render; pass "
                    "--chat-template chatml for plain ChatML", src);
        if (strstr(t, "You are"))
            MT_FAIL(MT_ERR_UNSUPPORTED, "%s: the chat template is a ChatML one with a default "
                    "system prompt (as Qwen2's), which meshtrain does not render; pass "
                    "--chat-template chatml for plain ChatML (give each record its system "
                    "message)", src);
        *out = MT_CHAT_CHATML;
        return MT_OK;
    }
    MT_FAIL(MT_ERR_UNSUPPORTED, "%s: the chat template is neither Llama 3's nor ChatML's (no "
            "<|start_header_id|>/<|eot_id|> or <|im_start|>/<|im_end|> markers); meshtrain "
            "renders only llama3 and chatml", src);
}

/* Python's str.strip() whitespace (what Jinja's trim filter removes): the
 * ASCII ones, U+001C..U+001F, U+0085, U+00A0, U+1680, U+2000..U+200A,
 * U+2028, U+2029, U+202F, U+205F, U+3000.  Returns the byte length of the
 * whitespace character at s, or 0. */
static size_t ws_len(const unsigned char *s, size_t n)
{
    if (s[0] == ' ' || (s[0] >= 0x09 && s[0] <= 0x0d) || (s[0] >= 0x1c && s[0] <= 0x1f))
        return 1;
    if (n >= 2 && s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0))
        return 2;
    if (n >= 3 && s[0] == 0xe1 && s[1] == 0x9a && s[2] == 0x80)
        return 3;
    if (n >= 3 && s[0] == 0xe2 && s[1] == 0x80 &&
        (s[2] <= 0x8a || s[2] == 0xa8 || s[2] == 0xa9 || s[2] == 0xaf))
        return 3;
    if (n >= 3 && s[0] == 0xe2 && s[1] == 0x81 && s[2] == 0x9f)
        return 3;
    if (n >= 3 && s[0] == 0xe3 && s[1] == 0x80 && s[2] == 0x80)
        return 3;
    return 0;
}

static void trim(const char **s, size_t *n)
{
    const unsigned char *u = (const unsigned char *)*s;
    size_t a = 0, b = *n, k;
    while (a < b && (k = ws_len(u + a, b - a)) > 0)
        a += k;
    for (;;) { /* the last character: step back over continuation bytes */
        size_t c = b;
        while (c > a && (u[c - 1] & 0xc0) == 0x80)
            c--;
        if (c == a || b - (c - 1) > 4)
            break;
        c--;
        if (ws_len(u + c, b - c) != b - c)
            break;
        b = c;
    }
    *s += a;
    *n = b - a;
}

/* Encode a piece and give its ids mask value m. */
static mt_status_t piece(const mt_tokenizer_t *tok, const char *s, size_t n, char m,
                         mt_ids_t *ids, mt_text_t *mask)
{
    size_t before = ids->n;
    MT_TRY(mt_tokenizer_encode(tok, s, n, false, ids));
    for (size_t i = before; i < ids->n; i++)
        MT_TRY(mt_text_append(mask, &m, 1));
    return MT_OK;
}

static mt_status_t piece2(const mt_tokenizer_t *tok, const char *a, const char *b,
                          const char *c, char m, mt_ids_t *ids, mt_text_t *mask)
{
    mt_text_t t = {0};
    mt_status_t s = mt_text_append(&t, a, strlen(a));
    if (s == MT_OK)
        s = mt_text_append(&t, b, strlen(b));
    if (s == MT_OK)
        s = mt_text_append(&t, c, strlen(c));
    if (s == MT_OK)
        s = piece(tok, t.s, t.n, m, ids, mask);
    mt_text_free(&t);
    return s;
}

static mt_status_t close_with_eos(const mt_tokenizer_t *tok, const char *where, mt_ids_t *ids,
                                  mt_text_t *mask, size_t start)
{
    int32_t eos = mt_tokenizer_eos_id(tok);
    if (eos < 0)
        MT_FAIL(MT_ERR_CONFIG, "%s: the tokenizer has no EOS token to end the record with",
                where);
    if (ids->n == start || ids->v[ids->n - 1] != eos) {
        MT_TRY(mt_ids_push(ids, eos));
        MT_TRY(mt_text_append(mask, "\1", 1));
    }
    return MT_OK;
}

static mt_status_t string_field(const json_t *obj, const char *key, const char *where,
                                const char *what, const char **s, size_t *n)
{
    const json_t *v = json_object_get(obj, key);
    if (!v)
        MT_FAIL(MT_ERR_CONFIG, "%s: %s has no key \"%s\"", where, what, key);
    if (!json_is_string(v))
        MT_FAIL(MT_ERR_CONFIG, "%s: %s: \"%s\" is not a string", where, what, key);
    *s = json_string_value(v);
    *n = json_string_length(v);
    return MT_OK;
}

static mt_status_t prompt_completion(const mt_tokenizer_t *tok, const mt_dw_opts_t *o,
                                     const json_t *rec, const char *where, mt_ids_t *ids,
                                     mt_text_t *mask)
{
    const char *p, *c;
    size_t np, nc;
    MT_TRY(string_field(rec, o->prompt_key, where, "the record", &p, &np));
    MT_TRY(string_field(rec, o->completion_key, where, "the record", &c, &nc));
    if (nc == 0)
        MT_FAIL(MT_ERR_CONFIG, "%s: empty document: \"%s\" is an empty string", where,
                o->completion_key);
    mt_ids_t pid = {0};
    mt_text_t full = {0};
    mt_status_t s = mt_tokenizer_encode(tok, p, np, true, &pid);
    if (s == MT_OK)
        s = mt_text_append(&full, p, np);
    if (s == MT_OK)
        s = mt_text_append(&full, c, nc);
    size_t start = ids->n;
    if (s == MT_OK)
        s = mt_tokenizer_encode(tok, full.s, full.n, true, ids);
    for (size_t i = start; s == MT_OK && i < ids->n; i++)
        s = mt_text_append(mask, i - start < pid.n ? "\0" : "\1", 1);
    if (s == MT_OK)
        s = close_with_eos(tok, where, ids, mask, start);
    mt_ids_free(&pid);
    mt_text_free(&full);
    MT_TRY(s);
    return MT_OK;
}

static mt_status_t chat(const mt_tokenizer_t *tok, mt_chat_t tmpl, const json_t *msgs,
                        const char *key, const char *where, mt_ids_t *ids, mt_text_t *mask)
{
    if (!json_is_array(msgs))
        MT_FAIL(MT_ERR_CONFIG, "%s: \"%s\" is not an array of messages", where, key);
    size_t n = json_array_size(msgs);
    if (n == 0)
        MT_FAIL(MT_ERR_CONFIG, "%s: empty document: \"%s\" has no messages", where, key);
    size_t start = ids->n;
    if (tmpl == MT_CHAT_LLAMA3 && mt_tokenizer_bos_id(tok) >= 0) {
        MT_TRY(mt_ids_push(ids, mt_tokenizer_bos_id(tok)));
        MT_TRY(mt_text_append(mask, "\0", 1));
    }
    for (size_t i = 0; i < n; i++) {
        char what[64];
        snprintf(what, sizeof what, "message %zu", i);
        const json_t *m = json_array_get(msgs, i);
        if (!json_is_object(m))
            MT_FAIL(MT_ERR_CONFIG, "%s: %s is not an object", where, what);
        const char *role, *content;
        size_t nr, nc;
        MT_TRY(string_field(m, "role", where, what, &role, &nr));
        MT_TRY(string_field(m, "content", where, what, &content, &nc));
        int assistant = strcmp(role, "assistant") == 0;
        if (!assistant && strcmp(role, "user") != 0 && strcmp(role, "system") != 0)
            MT_FAIL(MT_ERR_CONFIG, "%s: %s has role \"%s\" (meshtrain renders system, user "
                    "and assistant)", where, what, role);
        if (i == n - 1 && !assistant)
            MT_FAIL(MT_ERR_CONFIG, "%s: the last message is \"%s\", not \"assistant\": the "
                    "record ends with nothing to learn", where, role);
        char a = assistant ? 1 : 0;
        if (tmpl == MT_CHAT_LLAMA3) {
            trim(&content, &nc);
            MT_TRY(piece2(tok, "<|start_header_id|>", role, "<|end_header_id|>\n\n", 0, ids,
                          mask));
            MT_TRY(piece(tok, content, nc, a, ids, mask));
            MT_TRY(piece(tok, "<|eot_id|>", 10, a, ids, mask));
        } else {
            MT_TRY(piece2(tok, "<|im_start|>", role, "\n", 0, ids, mask));
            MT_TRY(piece(tok, content, nc, a, ids, mask));
            MT_TRY(piece(tok, "<|im_end|>", 10, a, ids, mask));
            if (i + 1 < n)
                MT_TRY(piece(tok, "\n", 1, 0, ids, mask));
        }
    }
    MT_TRY(close_with_eos(tok, where, ids, mask, start));
    return MT_OK;
}

mt_status_t mt_sft_record(const mt_tokenizer_t *tok, const mt_dw_opts_t *o, const void *record,
                          const char *where, mt_ids_t *ids, mt_text_t *mask)
{
    const json_t *rec = record;
    if (!json_is_object(rec))
        MT_FAIL(MT_ERR_CONFIG, "%s: the record is not a JSON object", where);
    const json_t *msgs = json_object_get(rec, o->messages_key);
    if (msgs) {
        mt_chat_t tmpl; /* resolved here: prompt/completion records need no template */
        MT_TRY(mt_chat_resolve(tok, o->chat, &tmpl));
        MT_TRY(chat(tok, tmpl, msgs, o->messages_key, where, ids, mask));
        return MT_OK;
    }
    if (!json_object_get(rec, o->prompt_key) && !json_object_get(rec, o->completion_key))
        MT_FAIL(MT_ERR_CONFIG, "%s: the record has neither \"%s\" nor \"%s\" and \"%s\"", where,
                o->messages_key, o->prompt_key, o->completion_key);
    MT_TRY(prompt_completion(tok, o, rec, where, ids, mask));
    return MT_OK;
}
