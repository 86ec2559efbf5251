#pragma once
#include <cstdio>
#include <string>
#include <vector>
namespace oml::review::testing {
// Escapes a PDF literal string's delimiters.
inline std::string PdfLiteral(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '(' || c == ')' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}
// A minimal valid PDF 1.4: one page per entry of `pages`, each line of a page drawn in Helvetica
// 12pt, 14pt apart from the top. `encrypt`: adds a Standard security handler dictionary whose
// /U entry matches no password, so a reader finds the document locked.
inline std::string MakePdf(const std::vector<std::vector<std::string>>& pages, bool encrypt = false) {
  std::vector<std::string> objs;  // objs[i] is object i+1's body
  const int n = static_cast<int>(pages.size());
  const int font = 3 + 2 * n;
  objs.push_back("<< /Type /Catalog /Pages 2 0 R >>");
  std::string kids;
  for (int i = 0; i < n; ++i) kids += (i ? " " : "") + std::to_string(3 + 2 * i) + " 0 R";
  objs.push_back("<< /Type /Pages /Kids [" + kids + "] /Count " + std::to_string(n) + " >>");
  for (int i = 0; i < n; ++i) {
    objs.push_back("<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 " +
                   std::to_string(font) + " 0 R >> >> /Contents " + std::to_string(4 + 2 * i) + " 0 R >>");
    std::string content = "BT /F1 12 Tf 14 TL 72 720 Td";
    for (const auto& line : pages[i]) content += " (" + PdfLiteral(line) + ") Tj T*";
    content += " ET";
    objs.push_back("<< /Length " + std::to_string(content.size()) + " >>\nstream\n" + content + "\nendstream");
  }
  objs.push_back("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>");
  if (encrypt) {
    objs.push_back("<< /Filter /Standard /V 1 /R 2 /Length 40 /P -4 /O <" + std::string(64, 'a') + "> /U <" +
                   std::string(64, 'b') + "> >>");
  }
  std::string pdf = "%PDF-1.4\n%\xE2\xE3\xCF\xD3\n";
  std::vector<size_t> offsets;
  for (size_t i = 0; i < objs.size(); ++i) {
    offsets.push_back(pdf.size());
    pdf += std::to_string(i + 1) + " 0 obj\n" + objs[i] + "\nendobj\n";
  }
  const size_t xref = pdf.size();
  pdf += "xref\n0 " + std::to_string(objs.size() + 1) + "\n0000000000 65535 f \n";
  for (size_t off : offsets) {
    char line[24];
    std::snprintf(line, sizeof line, "%010zu 00000 n \n", off);
    pdf += line;
  }
  pdf += "trailer\n<< /Size " + std::to_string(objs.size() + 1) + " /Root 1 0 R";
  if (encrypt) pdf += " /Encrypt " + std::to_string(objs.size()) + " 0 R /ID [<0123456789abcdef0123456789abcdef> <0123456789abcdef0123456789abcdef>]";
  pdf += " >>\nstartxref\n" + std::to_string(xref) + "\n%%EOF\n";
  return pdf;
}
}
