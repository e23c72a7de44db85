// CUDA binder of one layout (host compiler; sees only the facade of cuda_ops.hpp). CMakeLists.txt
// compiles this file once per layout with DHISPARSE_PY_LAYOUT and DHISPARSE_PY_HOT_ROWS.
#include <dhisparse/layouts/deepseek_v41_flash.hpp>
#include <dhisparse/layouts/glm53.hpp>
#include <dhisparse/layouts/tiny.hpp>

#include "cuda_bind.hpp"

#define DHISPARSE_PY_CAT2(a, b) a##b
#define DHISPARSE_PY_CAT(a, b) DHISPARSE_PY_CAT2(a, b)
#define DHISPARSE_PY_STR2(a) #a
#define DHISPARSE_PY_STR(a) DHISPARSE_PY_STR2(a)

namespace dhisparse::python {
void DHISPARSE_PY_CAT(bind_cuda_, DHISPARSE_PY_LAYOUT)(nb::module_& m) {
  bind_cuda_layout<layouts::DHISPARSE_PY_LAYOUT, DHISPARSE_PY_HOT_ROWS>(m, DHISPARSE_PY_STR(DHISPARSE_PY_LAYOUT));
}
}  // namespace dhisparse::python
