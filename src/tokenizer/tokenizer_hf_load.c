/* tokenizer_hf_load.c: reading a tokenizer.json into an mt_hftok: the
 * added tokens, the post-processor (as the ids it puts before and after
 * one sequence) and the id -> token table.
 * Fields meshtrain cannot honour (truncation, padding, other models) are
 * refused with the file's name rather than ignored. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tokenizer_hf.h"

void hf_free(struct mt_hftok *h)
{
    if (!h)
        return;
    hf_norm_free(h->norm);
    hf_pretok_free(h->pretok);
    hf_bpe_free(&h->bpe);
    hf_dec_free(h->dec);
    for (size_t i = 0; i < h->nadded; i++) {
        if (h->added[i].match != h->added[i].content)
            free(h->added[i].match);
        free(h->added[i].content);
    }
    free(h->added);
    free(h->aidx[0]);
    free(h->aidx[1]);
    hf_strmap_free(&h->added_map);
    free(h->pre);
    free(h->post);
    for (int64_t i = 0; h->tok && i < h->ntok; i++)
        free(h->tok[i]);
    free(h->tok);
    free(h->toklen);
    free(h->is_special);
    free(h->file);
    free(h);
}

static mt_status_t parse_added(struct mt_hftok *h, const json_t *a, int32_t *max_id)
{
    if (!a || json_is_null(a))
        return MT_OK;
    if (!json_is_array(a))
        MT_FAIL(MT_ERR_CONFIG, "%s: added_tokens is not an array", h->file);
    h->added = calloc(json_array_size(a) + 1, sizeof *h->added);
    if (!h->added)
        MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < json_array_size(a); i++) {
        const json_t *e = json_array_get(a, i), *id = json_object_get(e, "id");
        const char *c = hf_json_str(e, "content");
        if (!c || !*c || !json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= INT32_MAX)
            MT_FAIL(MT_ERR_CONFIG, "%s: added_tokens[%zu] needs a non-empty \"content\" and an "
                    "\"id\"", h->file, i);
        if (!hf_utf8_valid(c, strlen(c)))
            MT_FAIL(MT_ERR_CONFIG, "%s: added_tokens[%zu] is not UTF-8", h->file, i);
        hf_added *t = &h->added[h->nadded];
        if (!(t->content = strdup(c)))
            MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory");
        h->nadded++;
        t->len = strlen(c);
        t->id = (int32_t)json_integer_value(id);
        t->special = hf_json_bool(e, "special", false);
        t->lstrip = hf_json_bool(e, "lstrip", false);
        t->rstrip = hf_json_bool(e, "rstrip", false);
        t->single_word = hf_json_bool(e, "single_word", false);
        t->normalized = hf_json_bool(e, "normalized", !t->special);
        if (t->id > *max_id)
            *max_id = t->id;
        MT_TRY(hf_strmap_put(&h->added_map, c, t->len, t->id));
    }
    return MT_OK;
}

static mt_status_t ids_append(int32_t **v, size_t *n, int32_t id)
{
    int32_t *q = realloc(*v, (*n + 1) * sizeof *q);
    if (!q)
        MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory");
    q[(*n)++] = id;
    *v = q;
    return MT_OK;
}

/* A special token of the post-processor, named by its string. */
static mt_status_t special_id(struct mt_hftok *h, const char *tok, const char *what, int32_t *id)
{
    *id = hf_token_to_id(h, tok);
    if (*id < 0)
        MT_FAIL(MT_ERR_CONFIG, "%s: post_processor %s: token \"%s\" is not in the vocabulary",
                h->file, what, tok);
    return MT_OK;
}

static mt_status_t parse_template(struct mt_hftok *h, const json_t *p)
{
    const json_t *single = json_object_get(p, "single"), *sp = json_object_get(p, "special_tokens");
    if (!json_is_array(single))
        MT_FAIL(MT_ERR_CONFIG, "%s: post_processor TemplateProcessing: \"single\" is not an array",
                h->file);
    /* an outer processor wraps what the inner ones produced */
    int32_t *pre = NULL, *post = NULL;
    size_t npre = 0, npost = 0;
    bool seen_a = false;
    mt_status_t st = MT_OK;
    for (size_t i = 0; st == MT_OK && i < json_array_size(single); i++) {
        const json_t *e = json_array_get(single, i), *tok = json_object_get(e, "SpecialToken");
        if (json_object_get(e, "Sequence")) {
            const char *a = hf_json_str(json_object_get(e, "Sequence"), "id");
            if (!a || strcmp(a, "A") != 0 || seen_a)
                st = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__,
                                  "%s: post_processor TemplateProcessing: single[%zu] must be "
                                  "the one sequence A", h->file, i);
            seen_a = true;
            continue;
        }
        const char *name = hf_json_str(tok, "id");
        const json_t *def = json_object_get(sp, name ? name : "");
        const json_t *ids = json_object_get(def, "ids");
        if (!name || !json_is_array(ids)) {
            st = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__,
                              "%s: post_processor TemplateProcessing: single[%zu] names no "
                              "entry of special_tokens", h->file, i);
            break;
        }
        for (size_t k = 0; st == MT_OK && k < json_array_size(ids); k++) {
            const json_t *x = json_array_get(ids, k);
            if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                json_integer_value(x) >= INT32_MAX)
                st = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__,
                                  "%s: post_processor special_tokens[\"%s\"]: ids[%zu] is not "
                                  "an id", h->file, name, k);
            else
                st = seen_a ? ids_append(&post, &npost, (int32_t)json_integer_value(x))
                            : ids_append(&pre, &npre, (int32_t)json_integer_value(x));
        }
    }
    if (st == MT_OK && !seen_a)
        st = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__,
                          "%s: post_processor TemplateProcessing: \"single\" has no $A", h->file);
    for (size_t i = 0; st == MT_OK && i < h->npre; i++)
        st = ids_append(&pre, &npre, h->pre[i]);
    for (size_t i = 0; st == MT_OK && i < npost; i++)
        st = ids_append(&h->post, &h->npost, post[i]);
    free(h->pre);
    h->pre = pre;
    h->npre = npre;
    free(post);
    return st;
}

static mt_status_t parse_post(struct mt_hftok *h, const json_t *p)
{
    const char *type;
    MT_TRY(hf_json_type(p, h->file, "post_processor", &type));
    if (strcmp(type, "ByteLevel") == 0)
        return MT_OK; /* it only trims offsets */
    if (strcmp(type, "TemplateProcessing") == 0)
        return parse_template(h, p);
    if (strcmp(type, "Sequence") == 0) {
        const json_t *a = json_object_get(p, "processors");
        if (!json_is_array(a))
            MT_FAIL(MT_ERR_CONFIG, "%s: post_processor Sequence: \"processors\" is not an array",
                    h->file);
        for (size_t i = 0; i < json_array_size(a); i++)
            MT_TRY(parse_post(h, json_array_get(a, i)));
        return MT_OK;
    }
    if (strcmp(type, "RobertaProcessing") == 0 || strcmp(type, "BertProcessing") == 0) {
        const json_t *cls = json_object_get(p, "cls"), *sep = json_object_get(p, "sep");
        if (!json_is_array(cls) || !json_is_string(json_array_get(cls, 0)) ||
            !json_is_array(sep) || !json_is_string(json_array_get(sep, 0)))
            MT_FAIL(MT_ERR_CONFIG, "%s: post_processor %s: \"cls\" and \"sep\" must be "
                    "[token, id]", h->file, type);
        int32_t c, s;
        MT_TRY(special_id(h, json_string_value(json_array_get(cls, 0)), type, &c));
        MT_TRY(special_id(h, json_string_value(json_array_get(sep, 0)), type, &s));
        int32_t *pre = malloc((h->npre + 1) * sizeof *pre);
        if (!pre)
            MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory");
        pre[0] = c;
        if (h->npre)
            memcpy(pre + 1, h->pre, h->npre * sizeof *pre);
        free(h->pre);
        h->pre = pre;
        h->npre++;
        return ids_append(&h->post, &h->npost, s);
    }
    MT_FAIL(MT_ERR_UNSUPPORTED, "%s: post_processor \"%s\" is not supported (TemplateProcessing, "
            "ByteLevel, RobertaProcessing, BertProcessing, Sequence are)", h->file, type);
}

static mt_status_t build_table(struct mt_hftok *h, int32_t max_id)
{
    h->ntok = (int64_t)max_id + 1;
    h->tok = calloc((size_t)h->ntok, sizeof *h->tok);
    h->toklen = calloc((size_t)h->ntok, sizeof *h->toklen);
    h->is_special = calloc((size_t)h->ntok, sizeof *h->is_special);
    if (!h->tok || !h->toklen || !h->is_special)
        MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory for %lld tokens", (long long)h->ntok);
    const hf_strmap *v = &h->bpe.vocab;
    for (size_t i = 0; i <= v->mask; i++) {
        if (!v->key[i])
            continue;
        int32_t id = v->val[i];
        if (h->tok[id])
            MT_FAIL(MT_ERR_CONFIG, "%s: model.vocab: id %d is given to \"%s\" and \"%s\"", h->file,
                    id, h->tok[id], v->key[i]);
        if (!(h->tok[id] = strdup(v->key[i])))
            MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory");
        h->toklen[id] = v->klen[i];
    }
    for (size_t i = 0; i < h->nadded; i++) {
        hf_added *t = &h->added[i];
        h->is_special[t->id] = t->special;
        if (h->tok[t->id]) {
            if (strcmp(h->tok[t->id], t->content) == 0)
                continue;
            free(h->tok[t->id]); /* the added token's string wins, as in Rust */
        }
        if (!(h->tok[t->id] = strdup(t->content)))
            MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory");
        h->toklen[t->id] = t->len;
    }
    return MT_OK;
}

static mt_status_t load_json(struct mt_hftok *h, const json_t *root)
{
    if (!json_is_object(root))
        MT_FAIL(MT_ERR_CONFIG, "%s: not a JSON object", h->file);
    static const char *refused[] = {"truncation", "padding"};
    for (int i = 0; i < 2; i++) {
        const json_t *v = json_object_get(root, refused[i]);
        if (v && !json_is_null(v))
            MT_FAIL(MT_ERR_UNSUPPORTED, "%s: \"%s\" is set; meshtrain does not apply it (set it "
                    "to null)", h->file, refused[i]);
    }
    const json_t *model = json_object_get(root, "model");
    const char *mtype = hf_json_str(model, "type");
    if (!json_is_object(model))
        MT_FAIL(MT_ERR_CONFIG, "%s: no \"model\" object", h->file);
    if (!mtype && json_object_get(model, "merges"))
        mtype = "BPE"; /* older files leave the type out */
    if (!mtype || strcmp(mtype, "BPE") != 0)
        MT_FAIL(MT_ERR_UNSUPPORTED, "%s: model \"%s\" is not supported (only BPE is)", h->file,
                mtype ? mtype : "(no type)");
    int32_t max_id = -1;
    MT_TRY(hf_bpe_parse(model, h->file, &h->bpe, &max_id));
    MT_TRY(parse_added(h, json_object_get(root, "added_tokens"), &max_id));
    const json_t *n = json_object_get(root, "normalizer"), *p = json_object_get(root, "pre_tokenizer");
    const json_t *pp = json_object_get(root, "post_processor"), *d = json_object_get(root, "decoder");
    if (n && !json_is_null(n))
        MT_TRY(hf_norm_parse(n, h->file, &h->norm));
    if (p && !json_is_null(p))
        MT_TRY(hf_pretok_parse(p, h->file, &h->pretok));
    if (d && !json_is_null(d))
        MT_TRY(hf_dec_parse(d, h->file, &h->dec));
    MT_TRY(build_table(h, max_id));
    MT_TRY(hf_added_index(h));
    if (pp && !json_is_null(pp))
        MT_TRY(parse_post(h, pp));
    for (size_t i = 0; i < h->npre + h->npost; i++) {
        int32_t id = i < h->npre ? h->pre[i] : h->post[i - h->npre];
        if (id >= h->ntok)
            MT_FAIL(MT_ERR_CONFIG, "%s: post_processor: id %d is outside the vocabulary", h->file,
                    id);
    }
    return MT_OK;
}

mt_status_t hf_load(const char *file, struct mt_hftok **out)
{
    *out = NULL;
    struct mt_hftok *h = calloc(1, sizeof *h);
    if (!h || !(h->file = strdup(file))) {
        free(h);
        MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory");
    }
    json_error_t je;
    json_t *root = json_load_file(file, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        mt_status_t st = mt_error_set(MT_ERR_IO, __FILE__, __LINE__, "%s:%d: %s", file, je.line,
                                      je.text);
        hf_free(h);
        return st;
    }
    mt_status_t st = load_json(h, root);
    json_decref(root);
    if (st != MT_OK) {
        hf_free(h);
        return st;
    }
    *out = h;
    return MT_OK;
}

int32_t hf_token_to_id(const struct mt_hftok *h, const char *token)
{
    size_t n = strlen(token);
    int32_t id = hf_strmap_get(&h->added_map, token, n);
    return id >= 0 ? id : hf_strmap_get(&h->bpe.vocab, token, n);
}
