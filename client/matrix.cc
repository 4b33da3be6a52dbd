#include "client/matrix.h"

#include <cstring>

namespace warmpool::client {

v1::Tensor ToTensor(const Matrix& m) {
  v1::Tensor t;
  t.set_rows(m.rows);
  t.set_cols(m.cols);
  t.set_data(reinterpret_cast<const char*>(m.data.data()), m.data.size() * sizeof(float));
  return t;
}

Result<Matrix> FromTensor(const v1::Tensor& t) {
  if (t.data().size() != uint64_t{t.rows()} * t.cols() * sizeof(float)) {
    return Error(Code::kInternal, "reply tensor {} x {} holds {} bytes", t.rows(), t.cols(),
                 t.data().size());
  }
  Matrix m{t.rows(), t.cols(), std::vector<float>(uint64_t{t.rows()} * t.cols())};
  std::memcpy(m.data.data(), t.data().data(), t.data().size());
  return m;
}

}  // namespace warmpool::client
