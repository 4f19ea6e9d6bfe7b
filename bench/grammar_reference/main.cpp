// llama.cpp's own JSON-schema converter, as a command: reads {"name": schema, ...} on
// stdin, writes {"name": {"grammar": GBNF} | {"error": message}, ...} on stdout.
// Built by bench/make_grammar_fixtures.py against the llama.cpp that llama-cpp-python
// vendors; benchmark and fixture tooling only (CI reads the committed fixtures).
#include "json-schema-to-grammar.h"
#include "json.h"

#include <iostream>
#include <iterator>
#include <string>

int main() {
    std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    common_json schemas = common_json::parse(text);
    std::string out = "{";
    bool first = true;
    for (const auto & [name, schema] : schemas.items()) {
        common_json entry = common_json::parse("{}");
        std::string result;
        try {
            result = "{\"grammar\": " + common_json::make(json_schema_to_grammar(schema, true)).dump() + "}";
        } catch (const std::exception & e) {
            result = "{\"error\": " + common_json::make(std::string(e.what())).dump() + "}";
        }
        out += (first ? "\n" : ",\n") + common_json::make(name).dump() + ": " + result;
        first = false;
    }
    std::cout << out << "\n}\n";
    return 0;
}
