# Writes a C++ source that holds a file's bytes as a raw string literal:
#   cmake -DINPUT=file -DOUTPUT=out.cc -DSYMBOL=kName -P embed_file.cmake
# defines `const char moesh::embedded::<SYMBOL>[]` and `const size_t <SYMBOL>Size`.
file(READ "${INPUT}" content)
set(delimiter "moesh_embed")
string(FIND "${content}" ")${delimiter}\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains the raw-string delimiter )${delimiter}\"")
endif()
file(WRITE "${OUTPUT}.tmp"
  "// Generated from ${INPUT} by common/tokenizer/embed_file.cmake. Do not edit.\n"
  "#include <cstddef>\n"
  "namespace moesh::embedded {\n"
  "extern const char ${SYMBOL}[];\n"
  "extern const size_t ${SYMBOL}Size;\n"
  "const char ${SYMBOL}[] = R\"${delimiter}(${content})${delimiter}\";\n"
  "const size_t ${SYMBOL}Size = sizeof(${SYMBOL}) - 1;\n"
  "}  // namespace moesh::embedded\n")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
