/* tokenizer_hf_config.c: a Hugging Face tokenizer behind the handle: the
 * path (a tokenizer.json, or a directory holding one) and the
 * tokenizer_config.json beside it, which names BOS, EOS and the chat
 * template.  Without that file BOS and EOS are the post-processor's
 * special tokens before and after the sequence, or none (doc/tokenizer.md). */
#include <config.h>

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "tokenizer_hf.h"

mt_status_t hf_attach(const char *spec, mt_tokenizer_t *t);

/* bos_token / eos_token: a string, an {"content": ...} object, or null. */
static mt_status_t config_token(const struct mt_hftok *h, const json_t *cfg, const char *key,
                                const char *cfgfile, int32_t *id)
{
    const json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v))
        return MT_OK; /* keeps the post-processor's choice */
    const char *s = json_is_string(v) ? json_string_value(v) : hf_json_str(v, "content");
    if (!s)
        MT_FAIL(MT_ERR_CONFIG, "%s: \"%s\" is neither a string nor {\"content\": ...}", cfgfile,
                key);
    *id = hf_token_to_id(h, s);
    if (*id < 0)
        MT_FAIL(MT_ERR_CONFIG, "%s: %s \"%s\" is not a token of %s", cfgfile, key, s, h->file);
    return MT_OK;
}

static mt_status_t read_config(mt_tokenizer_t *t, const char *cfgfile)
{
    json_error_t je;
    /* model_max_length is often 1e30, beyond an int64: numbers as reals */
    json_t *cfg = json_load_file(cfgfile, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &je);
    if (!cfg)
        MT_FAIL(MT_ERR_IO, "%s:%d: %s", cfgfile, je.line, je.text);
    mt_status_t st = MT_OK;
    if (!json_is_object(cfg))
        st = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__, "%s: not a JSON object", cfgfile);
    if (st == MT_OK)
        st = config_token(t->hf, cfg, "bos_token", cfgfile, &t->bos_id);
    if (st == MT_OK)
        st = config_token(t->hf, cfg, "eos_token", cfgfile, &t->eos_id);
    const json_t *ct = json_object_get(cfg, "chat_template");
    const char *tpl = NULL;
    if (st == MT_OK && json_is_string(ct))
        tpl = json_string_value(ct);
    else if (st == MT_OK && json_is_array(ct)) {
        /* a list of named templates: "default" is the one for chat */
        for (size_t i = 0; i < json_array_size(ct); i++) {
            const json_t *e = json_array_get(ct, i);
            const char *name = hf_json_str(e, "name");
            if (name && strcmp(name, "default") == 0)
                tpl = hf_json_str(e, "template");
        }
        if (!tpl)
            st = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__,
                              "%s: chat_template is a list without a \"default\" template",
                              cfgfile);
    } else if (st == MT_OK && ct && !json_is_null(ct))
        st = mt_error_set(MT_ERR_CONFIG, __FILE__, __LINE__,
                          "%s: chat_template is neither a string nor a list", cfgfile);
    if (st == MT_OK && tpl && !(t->chat_template = strdup(tpl)))
        st = mt_error_set(MT_ERR_NOMEM, __FILE__, __LINE__, "tokenizer: out of memory");
    json_decref(cfg);
    return st;
}

static char *join(const char *dir, size_t n, const char *name)
{
    char *p = malloc(n + strlen(name) + 2);
    if (p) {
        memcpy(p, dir, n);
        p[n] = '/';
        strcpy(p + n + 1, name);
    }
    return p;
}

mt_status_t hf_attach(const char *spec, mt_tokenizer_t *t)
{
    struct stat sb;
    if (stat(spec, &sb) != 0)
        MT_FAIL(MT_ERR_IO, "%s: no such tokenizer (\"byte\", a tokenizer.json, or a directory "
                "with one)", spec);
    size_t dl;
    char *file;
    if (S_ISDIR(sb.st_mode)) {
        dl = strlen(spec);
        while (dl > 1 && spec[dl - 1] == '/')
            dl--;
        file = join(spec, dl, "tokenizer.json");
    } else {
        const char *sl = strrchr(spec, '/');
        dl = sl ? (size_t)(sl - spec) : 1;
        file = strdup(spec);
    }
    char *cfgfile = strrchr(spec, '/') || S_ISDIR(sb.st_mode)
                        ? join(spec, dl, "tokenizer_config.json")
                        : strdup("./tokenizer_config.json");
    if (!file || !cfgfile) {
        free(file);
        free(cfgfile);
        MT_FAIL(MT_ERR_NOMEM, "tokenizer: out of memory");
    }
    t->kind = MT_TOK_HF;
    t->path = file;
    if (S_ISDIR(sb.st_mode) && stat(file, &sb) != 0) {
        free(cfgfile);
        MT_FAIL(MT_ERR_IO, "%s: no tokenizer.json in this directory (vocab.json and merges.txt "
                "alone are not read)", spec);
    }
    mt_status_t st = hf_load(file, &t->hf);
    if (st == MT_OK) {
        t->vocab_size = t->hf->ntok;
        t->bos_id = t->hf->npre ? t->hf->pre[0] : -1;
        t->eos_id = t->hf->npost ? t->hf->post[t->hf->npost - 1] : -1;
        if (stat(cfgfile, &sb) == 0)
            st = read_config(t, cfgfile);
    }
    free(cfgfile);
    return st;
}
