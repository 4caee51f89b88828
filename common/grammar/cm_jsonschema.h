/* cm_jsonschema.h - structured-output constraints (JSON Schema, any JSON,
 * a choice of strings, a regular expression) compiled to GBNF for
 * cm_grammar.
 *
 * JSON Schema: type (and lists of types), properties (in their order),
 * required, additionalProperties (false, true or a schema; absent means
 * false when properties are given, as OpenAI's strict mode and xgrammar
 * do), enum, const, items, prefixItems, minItems, maxItems, anyOf / oneOf
 * (oneOf's exclusivity is not checked), allOf of one schema, $ref to
 * #/$defs/... or #/definitions/... (recursion allowed), minLength,
 * maxLength, format date / time / date-time / uuid / ipv4. Annotations
 * (title, description, default, examples, $schema, $id, $comment, ...) are
 * ignored. Any other keyword is refused, and the error names it and where
 * it is (a JSON pointer). The output is compact or lightly spaced JSON: at
 * most one newline and 20 blanks between tokens, so a model cannot spin on
 * whitespace. Numbers have at most 16 integer and 16 fraction digits and a
 * two-digit exponent (a double holds them); \u escapes exclude surrogates
 * (strict parsers refuse a lone one). */
#ifndef CM_JSONSCHEMA_H
#define CM_JSONSCHEMA_H

#include <jansson.h>
#include <stddef.h>

/* The schema as GBNF (*gbnf malloc'd). */
int cm_schema_gbnf(const json_t *schema, char **gbnf, char *err, size_t errlen);
/* The schema's rules alone, numbered from *next_rule (advanced past them),
 * so several schemas share one grammar; *root is the schema's rule (named
 * "s<root>"). They use the shared rules of cm_json_base_gbnf(). */
int cm_schema_rules(const json_t *schema, int *next_rule, char **rules, int *root, char *err, size_t errlen);
const char *cm_json_base_gbnf(void);
/* Any JSON object (response_format json_object). */
int cm_json_object_gbnf(char **gbnf);
/* Exactly one of the strings (vLLM's guided_choice). */
int cm_choice_gbnf(const char *const *choices, int n, char **gbnf, char *err, size_t errlen);
/* A regular expression (vLLM's guided_regex), anchored at both ends:
 * literals, ., [classes] with ranges and ^, \d \w \s \D \W \S, escapes,
 * (groups), (?:groups), named groups, |, and * + ? {m} {m,} {m,n} (lazy
 * ones match the same language). Backreferences, lookaround, assertions
 * and possessive quantifiers are refused by name. */
int cm_regex_gbnf(const char *re, size_t len, char **gbnf, char *err, size_t errlen);

#endif
